#include "app/group_state.h"

#include <fmt/format.h>

#include "app/laptop_credentials.h"
#include "common/clock.h"
#include "common/strings.h"
#include "compute/compute_client.h"
#include "compute/ec2_client.h"
#include "retry/sleeper.h"

namespace spotvisor {
namespace {

const SystemClock& TheClock() {
  static const SystemClock clock;
  return clock;
}

// One provider for every group of a cloud. A listing is short: credentials
// that could not be had for one group are not sought again for the next
// (on a laptop without keys, each try of the instance role costs seconds).
class SharedToken final : public TokenProvider {
 public:
  explicit SharedToken(std::shared_ptr<TokenProvider> p, std::shared_ptr<Status> failed)
      : p_(std::move(p)), failed_(std::move(failed)) {}
  StatusOr<std::string> AuthorizationHeader(const CallContext& ctx) override {
    if (!failed_->ok()) return *failed_;
    auto h = p_->AuthorizationHeader(ctx);
    if (!h.ok()) *failed_ = h.status();
    return h;
  }

 private:
  std::shared_ptr<TokenProvider> p_;
  std::shared_ptr<Status> failed_;
};
class SharedAws final : public AwsCredentialProvider {
 public:
  SharedAws(std::shared_ptr<AwsCredentialProvider> p, std::shared_ptr<Status> failed)
      : p_(std::move(p)), failed_(std::move(failed)) {}
  StatusOr<AwsCredentials> Get(const CallContext& ctx) override {
    if (!failed_->ok()) return *failed_;
    auto c = p_->Get(ctx);
    if (!c.ok()) *failed_ = c.status();
    return c;
  }
  void Invalidate() override { p_->Invalidate(); }
  std::string Source() const override { return p_->Source(); }

 private:
  std::shared_ptr<AwsCredentialProvider> p_;
  std::shared_ptr<Status> failed_;
};

}  // namespace

const GroupLookup& GroupStates::Get(const std::string& group, const std::string& zone) {
  std::string key = StartsWith(group, "projects/") ? group : group + "@" + RegionOfZone(zone);
  auto it = seen_.find(key);
  if (it == seen_.end()) it = seen_.emplace(key, Ask(group, zone)).first;
  return it->second;
}

GroupLookup GroupStates::Ask(const std::string& path, const std::string& zone) {
  static CancellableSleeper sleeper;
  GroupLookup out;
  // Ten seconds a group: a listing waits on nothing for long.
  auto ctx = Background().WithDeadline(std::chrono::steady_clock::now() + std::chrono::seconds(10));
  std::unique_ptr<GroupClient> client;
  if (StartsWith(path, "projects/")) {
    auto group = ParseMigUrl(path);
    if (!group.ok()) {
      out.error = group.status().message();
      return out;
    }
    if (!google_) {
      auto made = LaptopGoogleCredentials(o_.access_token_command, kCloudPlatformScope);
      google_ = made.ok() ? StatusOr<std::shared_ptr<TokenProvider>>(std::shared_ptr<TokenProvider>(std::move(*made)))
                          : StatusOr<std::shared_ptr<TokenProvider>>(made.status());
    }
    if (!google_->ok()) {
      out.error = google_->status().message();
      return out;
    }
    std::string endpoint = o_.compute_endpoint;
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    client = MakeMigClient(endpoint, *group, InstanceRef{}, std::make_unique<SharedToken>(**google_, google_failed_), sleeper);
  } else {
    auto region = RegionOfZone(zone);
    auto group = ParseAsgName(path, region);
    if (!group.ok() || region.empty()) {
      out.error = group.ok() ? fmt::format("no region for the Auto Scaling group {} (its boot's zone is \"{}\")", path, zone)
                             : group.status().message();
      return out;
    }
    if (!aws_) {
      auto made = DefaultAwsCredentials(TheClock());
      aws_ = made.ok() ? StatusOr<std::shared_ptr<AwsCredentialProvider>>(
                             std::shared_ptr<AwsCredentialProvider>(std::move(*made)))
                       : StatusOr<std::shared_ptr<AwsCredentialProvider>>(made.status());
    }
    if (!aws_->ok()) {
      out.error = aws_->status().message();
      return out;
    }
    client = MakeAsgClient("", *group, Ec2InstanceRef{"", region}, std::make_unique<SharedAws>(**aws_, aws_failed_), sleeper, TheClock());
  }
  auto state = client->State(ctx);
  if (state.ok()) {
    out.state = *state;
  } else {
    out.error = state.status().message();
  }
  return out;
}

std::string FormatGroupState(const GroupLookup& g) {
  if (!g.state) return "?";
  if (g.state->gone) return "gone";
  return fmt::format("{} of {}", g.state->instances, g.state->target);
}

}  // namespace spotvisor
