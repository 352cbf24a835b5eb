#include "app/group_state.h"

#include <fmt/format.h>

#include "app/laptop_credentials.h"
#include "common/clock.h"
#include "common/strings.h"
#include "compute/compute_client.h"
#include "compute/ec2_client.h"
#include "retry/sleeper.h"
#include "storage/aws_credentials.h"

namespace spotvisor {

GroupLookup LookUpGroup(const std::string& path, const std::string& zone, const RemoteOptions& o) {
  static const SystemClock clock;
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
    auto tokens = LaptopGoogleCredentials(o.access_token_command, kCloudPlatformScope);
    if (!tokens.ok()) {
      out.error = tokens.status().message();
      return out;
    }
    std::string endpoint = o.compute_endpoint;
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    client = MakeMigClient(endpoint, *group, InstanceRef{}, std::move(*tokens), sleeper);
  } else {
    auto region = RegionOfZone(zone);
    auto group = ParseAsgName(path, region);
    if (!group.ok() || region.empty()) {
      out.error = group.ok() ? fmt::format("no region for the Auto Scaling group {} (its boot's zone is \"{}\")", path, zone)
                             : group.status().message();
      return out;
    }
    auto creds = DefaultAwsCredentials(clock);
    if (!creds.ok()) {
      out.error = creds.status().message();
      return out;
    }
    client = MakeAsgClient("", *group, Ec2InstanceRef{"", region}, std::move(*creds), sleeper, clock);
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
