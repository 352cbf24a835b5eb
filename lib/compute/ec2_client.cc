#include "compute/ec2_client.h"

#include <map>
#include <string_view>

#include <fmt/format.h>

#include "common/strings.h"
#include "compute/aws_query.h"
#include "output/utf8.h"
#include "storage/s3_xml.h"
#include "storage/sigv4.h"

namespace spotvisor {
namespace {

// The instance's own calls: each one is idempotent (stopping a stopping
// instance, terminating a terminated one, setting a tag to its value, leaving
// a group already left), so the query client retries them briefly; if the API
// stays unreachable the caller powers off instead.
class QueryClient {
 public:
  QueryClient(AwsQueryApi api, std::string endpoint, Ec2InstanceRef i, std::unique_ptr<AwsCredentialProvider> creds,
              Sleeper& sleeper, const Clock& clock)
      : i_(std::move(i)), query_(api, std::move(endpoint), i_.region, std::move(creds), sleeper, clock) {}

 protected:
  Status Call(const char* action, const std::string& params, const std::string& what, const std::string& scope,
              const CallContext& ctx, std::string* answer = nullptr) {
    return query_.Call(action, params, what, scope, ctx, answer);
  }

  Ec2InstanceRef i_;
  AwsQueryClient query_;
};

class Ec2Client final : public QueryClient, public ComputeClient, public Ec2Tagger {
 public:
  using QueryClient::QueryClient;

  Status StopInstance(const CallContext& ctx) override { return Ec2Call("StopInstances", "stop", "", ctx); }
  Status DeleteInstance(const CallContext& ctx) override { return Ec2Call("TerminateInstances", "terminate", "", ctx); }
  Status SetTag(const std::string& key, const std::string& value, const CallContext& ctx) override {
    return Ec2Call("CreateTags", "tag", fmt::format("&Tag.1.Key={}&Tag.1.Value={}", AwsUriEncode(key, false),
                                                    AwsUriEncode(value.substr(0, 256), false)),
                   ctx);
  }

 private:
  Status Ec2Call(const char* action, const char* verb, const std::string& extra, const CallContext& ctx) {
    // CreateTags names its instance as a resource; the others as an instance.
    auto params = fmt::format("{}.1={}{}", std::string_view(action) == "CreateTags" ? "ResourceId" : "InstanceId",
                              AwsUriEncode(i_.instance_id, false), extra);
    return Call(action, params, fmt::format("{} instance {} ({})", verb, i_.instance_id, i_.region), "this instance", ctx);
  }
};

// One credential source for two APIs (the group's and EC2's).
class SharedCredentials final : public AwsCredentialProvider {
 public:
  explicit SharedCredentials(std::shared_ptr<AwsCredentialProvider> p) : p_(std::move(p)) {}
  StatusOr<AwsCredentials> Get(const CallContext& ctx) override { return p_->Get(ctx); }
  void Invalidate() override { p_->Invalidate(); }
  std::string Source() const override { return p_->Source(); }

 private:
  std::shared_ptr<AwsCredentialProvider> p_;
};

// Leaving an Auto Scaling group: TerminateInstanceInAutoScalingGroup with
// ShouldDecrementDesiredCapacity, so that the group launches nothing in its
// place. The answer is synchronous (an Activity, or a ValidationError).
// The instances of a DescribeAutoScalingGroups answer (one group): id ->
// LifecycleState.
std::map<std::string, std::string> Members(const std::string& xml) {
  std::map<std::string, std::string> out;
  auto list = xml.find("<Instances>");
  auto end = xml.find("</Instances>", list == std::string::npos ? 0 : list);
  if (list == std::string::npos || end == std::string::npos) return out;
  std::string_view instances(xml.data() + list, end - list);
  for (auto at = instances.find("<member>"); at != std::string_view::npos; at = instances.find("<member>", at + 1)) {
    auto stop = instances.find("</member>", at);
    if (stop == std::string_view::npos) break;
    auto member = instances.substr(at, stop - at);
    auto id = XmlText(member, "InstanceId");
    if (id && !id->empty()) out[*id] = XmlText(member, "LifecycleState").value_or("");
  }
  return out;
}

class AsgClient final : public QueryClient, public GroupClient {
 public:
  AsgClient(std::string endpoint, std::string ec2_endpoint, InstanceGroup g, Ec2InstanceRef i,
            std::shared_ptr<AwsCredentialProvider> creds, Sleeper& sleeper, const Clock& clock)
      : QueryClient(kAutoScalingQueryApi, std::move(endpoint), i, std::make_unique<SharedCredentials>(creds), sleeper,
                    clock),
        g_(std::move(g)), sleeper_(sleeper),
        ec2_(kEc2QueryApi, std::move(ec2_endpoint), i.region, std::make_unique<SharedCredentials>(creds), sleeper, clock) {}

  // group-delete-when-empty: the last instance (desired capacity 1, no
  // other member that is not on its way out) takes itself out of the group
  // without being terminated (DetachInstances, decrementing), deletes the
  // empty group, the launch template if `spotvisor launch` made it for this
  // group (the group's spotvisor-launch tag), and last terminates itself.
  // Others left, or no way to tell: Leave().
  Status LeaveAndCleanUp(const CallContext& ctx, std::vector<std::string>* deleted, std::string* skipped) override {
    auto group = AwsUriEncode(g_.name, false);
    auto scope = fmt::format("the group {}", g_.name);
    std::string xml;
    auto read = [&]() {
      xml.clear();
      return Call("DescribeAutoScalingGroups", "AutoScalingGroupNames.member.1=" + group,
                  fmt::format("describe {}", g_.Describe()), scope, ctx, &xml);
    };
    if (auto d = read(); !d.ok()) {
      if (skipped) *skipped = d.message();
      return Leave(ctx);
    }
    auto desired = ParseUint64(XmlText(xml, "DesiredCapacity").value_or(""));
    auto members = Members(xml);
    std::size_t others = 0;
    for (auto const& [id, state] : members) {
      // A gang's peers that left before this one stay listed a while.
      bool leaving = StartsWith(state, "Terminating") || StartsWith(state, "Detach");
      others += id != i_.instance_id && !leaving;
    }
    if (!desired || *desired != 1 || others > 0) return Leave(ctx);  // others stay
    std::string tpl;
    if (xml.find("<Key>spotvisor-launch</Key>") != std::string::npos) tpl = XmlText(xml, "LaunchTemplateName").value_or("");
    auto s = Call("DetachInstances",
                  fmt::format("AutoScalingGroupName={}&InstanceIds.member.1={}&ShouldDecrementDesiredCapacity=true", group,
                              AwsUriEncode(i_.instance_id, false)),
                  fmt::format("take this instance ({}) out of {}", i_.instance_id, g_.Describe()), scope, ctx);
    if (!s.ok()) {
      // A retry after a lost answer finds the instance gone from the group:
      // the detach took effect. Anything else: the plain leave still ends
      // the billing.
      bool detached = read().ok() && Members(xml).count(i_.instance_id) == 0 && XmlText(xml, "AutoScalingGroupName");
      if (!detached) {
        if (skipped) *skipped = s.message();
        return Leave(ctx);
      }
    }
    // A detach settles for a while: ResourceInUse until it has, as long as
    // the on-exit budget lasts.
    Status gone;
    for (int attempt = 0; attempt < 60; ++attempt) {
      gone = Call("DeleteAutoScalingGroup", "AutoScalingGroupName=" + group, fmt::format("delete {}", g_.Describe()),
                  scope, ctx);
      auto code = query_.last_code();
      // Not found: deleted by an earlier try whose answer was lost, or by someone else; gone either way.
      if (!gone.ok() && code == "ValidationError" && gone.message().find("not found") != std::string::npos) gone = OkStatus();
      if (gone.ok() || (code != "ResourceInUse" && code != "ScalingActivityInProgress")) break;
      ContextSleeper wait(ctx, &sleeper_);
      if (!wait.SleepFor(std::chrono::seconds(3))) break;
    }
    if (gone.ok() && deleted) deleted->push_back(g_.Describe());
    if (!gone.ok() && skipped) *skipped = gone.message();
    if (gone.ok() && !tpl.empty() && tpl.size() <= 128) {
      auto t = ec2_.Call("DeleteLaunchTemplate", "LaunchTemplateName=" + AwsUriEncode(tpl, false),
                         "delete the launch template " + output::EscapeInvalidUtf8(tpl), "launch templates", ctx);
      if ((t.ok() || t.code() == StatusCode::kNotFound) && deleted) {
        deleted->push_back("launch template " + output::EscapeInvalidUtf8(tpl));
      }
      if (!t.ok() && t.code() != StatusCode::kNotFound && skipped) *skipped = t.message();
    }
    // No group brings it back now: this instance goes by itself.
    auto t = ec2_.Call("TerminateInstances", "InstanceId.1=" + AwsUriEncode(i_.instance_id, false),
                       fmt::format("terminate instance {} ({})", i_.instance_id, i_.region), "this instance", ctx);
    if (t.ok() && deleted) deleted->push_back("instance " + i_.instance_id);
    return t;
  }

  std::string LeaveCall() const override { return "TerminateInstanceInAutoScalingGroup"; }

  // Which hooks hold a terminating instance: DescribeLifecycleHooks; then
  // CompleteLifecycleAction on each (completing one that is not waiting is
  // a ValidationError: the instance was not held by it, which is fine).
  Status CompleteTermination(const CallContext& ctx, std::vector<std::string>* hooks) override {
    std::string xml;
    auto group = AwsUriEncode(g_.name, false);
    auto s = Call("DescribeLifecycleHooks", "AutoScalingGroupName=" + group,
                  fmt::format("list the lifecycle hooks of {}", g_.Describe()), fmt::format("the group {}", g_.name), ctx, &xml);
    if (!s.ok()) return s;
    std::vector<std::string> names;
    for (std::size_t at = xml.find("<member>"); at != std::string::npos; at = xml.find("<member>", at + 1)) {
      auto end = xml.find("</member>", at);
      if (end == std::string::npos) break;
      std::string_view member(xml.data() + at, end - at);
      auto transition = XmlText(member, "LifecycleTransition");
      auto name = XmlText(member, "LifecycleHookName");
      if (transition && *transition == "autoscaling:EC2_INSTANCE_TERMINATING" && name && !name->empty() &&
          name->size() <= 255) {
        names.push_back(*name);
      }
    }
    Status first;
    for (auto const& hook : names) {
      auto c = Call("CompleteLifecycleAction",
                    fmt::format("AutoScalingGroupName={}&InstanceId={}&LifecycleActionResult=CONTINUE&LifecycleHookName={}",
                                group, AwsUriEncode(i_.instance_id, false), AwsUriEncode(hook, false)),
                    fmt::format("complete the lifecycle action of hook {} for this instance ({})",
                                output::EscapeInvalidUtf8(hook), i_.instance_id),
                    fmt::format("the group {}", g_.name), ctx);
      if (c.ok()) {
        if (hooks) hooks->push_back(output::EscapeInvalidUtf8(hook));
      } else if (c.code() != StatusCode::kInvalidArgument && first.ok()) {
        first = c;  // a ValidationError: this hook did not hold the instance
      }
    }
    return first;
  }
  StatusOr<GroupState> State(const CallContext& ctx) override {
    std::string xml;
    auto s = Call("DescribeAutoScalingGroups", "AutoScalingGroupNames.member.1=" + AwsUriEncode(g_.name, false),
                  fmt::format("describe {}", g_.Describe()), fmt::format("groups in {}", g_.location), ctx, &xml);
    if (!s.ok()) return s;
    GroupState state;
    // Unknown names are left out of the answer: no group, no member.
    auto name = XmlText(xml, "AutoScalingGroupName");
    if (!name || *name != g_.name) {
      state.gone = true;
      return state;
    }
    auto desired = ParseUint64(XmlText(xml, "DesiredCapacity").value_or(""));
    if (!desired || *desired > 100000) return InvalidArgumentError(fmt::format("describe {}: no DesiredCapacity in the answer", g_.Describe()));
    state.target = static_cast<int>(*desired);
    state.instances = static_cast<int>(Members(xml).size());
    return state;
  }

  Status Leave(const CallContext& ctx) override {
    auto s = Call("TerminateInstanceInAutoScalingGroup",
                  fmt::format("InstanceId={}&ShouldDecrementDesiredCapacity=true", AwsUriEncode(i_.instance_id, false)),
                  fmt::format("leave {} with this instance ({})", g_.Describe(), i_.instance_id),
                  fmt::format("the group {}", g_.name), ctx);
    // The group (or this instance's place in it) is not there: a
    // ValidationError "Instance Id not found - No managed instance found ...".
    if (s.code() == StatusCode::kInvalidArgument && s.message().find("No managed instance found") != std::string::npos) {
      return NotFoundError(s.message());
    }
    // A terminating lifecycle hook now holds the instance in
    // Terminating:Wait, billed, for nothing: the run is over and synced.
    // Best effort (a hook that has not caught the instance yet answers a
    // ValidationError, and its heartbeat timeout ends the wait).
    if (s.ok()) (void)CompleteTermination(ctx, nullptr);
    return s;
  }

 private:
  InstanceGroup g_;
  Sleeper& sleeper_;
  AwsQueryClient ec2_;
};

}  // namespace

std::string RegionOfZone(const std::string& zone) {
  // us-east-1a, eu-central-1b, ap-northeast-1c; us-west-2-lax-1a (local zone).
  auto parts = SplitOn(zone, '-');
  if (parts.size() < 3 || parts[2].empty()) return "";
  std::string digits;
  for (char c : parts[2]) {
    if (c < '0' || c > '9') break;
    digits += c;
  }
  if (digits.empty()) return "";
  return parts[0] + "-" + parts[1] + "-" + digits;
}

namespace {
std::unique_ptr<Ec2Client> MakeClient(std::string endpoint, Ec2InstanceRef instance,
                                      std::unique_ptr<AwsCredentialProvider> credentials, Sleeper& sleeper,
                                      const Clock& clock) {
  endpoint = AwsEndpoint(std::move(endpoint), {"AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL"},
                      fmt::format("https://ec2.{}.amazonaws.com", instance.region));
  return std::make_unique<Ec2Client>(kEc2QueryApi, std::move(endpoint), std::move(instance), std::move(credentials), sleeper,
                                     clock);
}
}  // namespace

std::unique_ptr<ComputeClient> MakeEc2ComputeClient(std::string endpoint, Ec2InstanceRef instance,
                                                    std::unique_ptr<AwsCredentialProvider> credentials, Sleeper& sleeper,
                                                    const Clock& clock) {
  return MakeClient(std::move(endpoint), std::move(instance), std::move(credentials), sleeper, clock);
}

std::unique_ptr<Ec2Tagger> MakeEc2Tagger(std::string endpoint, Ec2InstanceRef instance,
                                         std::unique_ptr<AwsCredentialProvider> credentials, Sleeper& sleeper,
                                         const Clock& clock) {
  return MakeClient(std::move(endpoint), std::move(instance), std::move(credentials), sleeper, clock);
}

std::unique_ptr<GroupClient> MakeAsgClient(std::string endpoint, InstanceGroup group, Ec2InstanceRef instance,
                                           std::unique_ptr<AwsCredentialProvider> credentials, Sleeper& sleeper,
                                           const Clock& clock) {
  endpoint = AwsEndpoint(std::move(endpoint), {"AWS_ENDPOINT_URL_AUTO_SCALING", "AWS_ENDPOINT_URL"},
                      fmt::format("https://autoscaling.{}.amazonaws.com", instance.region));
  auto ec2 = AwsEndpoint("", {"AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL"}, fmt::format("https://ec2.{}.amazonaws.com", instance.region));
  return std::make_unique<AsgClient>(std::move(endpoint), std::move(ec2), std::move(group), std::move(instance),
                                     std::shared_ptr<AwsCredentialProvider>(std::move(credentials)), sleeper, clock);
}

}  // namespace spotvisor
