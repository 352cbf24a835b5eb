#include "compute/ec2_client.h"

#include <cstdlib>

#include <fmt/format.h>

#include "common/strings.h"
#include "output/utf8.h"
#include "retry/retry_loop.h"
#include "storage/s3_xml.h"
#include "storage/sigv4.h"
#include "storage/transfer.h"

namespace spotvisor {
namespace {

constexpr char kApiVersion[] = "2016-11-15";

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// One AWS Query API (EC2's, Auto Scaling's): a form POST signed with SigV4.
struct QueryApi {
  const char* service;  // SigV4's service name
  const char* version;
  const char* prefix;   // of the IAM action, "ec2" / "autoscaling"
};
constexpr QueryApi kEc2Api{"ec2", kApiVersion, "ec2"};
constexpr QueryApi kAutoScalingApi{"autoscaling", "2011-01-01", "autoscaling"};

class QueryClient {
 public:
  QueryClient(QueryApi api, std::string endpoint, Ec2InstanceRef i, std::unique_ptr<AwsCredentialProvider> creds,
              Sleeper& sleeper, const Clock& clock)
      : api_(api), endpoint_(std::move(endpoint)), i_(std::move(i)), creds_(std::move(creds)), sleeper_(sleeper),
        clock_(clock), http_(MakeCurlHttpClient) {}

 protected:
  // Every call made here is idempotent (stopping a stopping instance,
  // terminating a terminated one, setting a tag to its value, leaving a
  // group already left), so transient failures are retried, briefly: if the
  // API stays unreachable the caller powers off instead. `params` follow
  // Action=...&; `what` names the call in errors, `scope` what the
  // permission is needed on.
  Status Call(const char* action, const std::string& params, const std::string& what, const std::string& scope,
              const CallContext& ctx, std::string* answer = nullptr) {
    LimitedErrorCountRetryPolicy retry(3);
    ExponentialBackoffPolicy backoff(std::chrono::milliseconds(500), std::chrono::seconds(4), 2.0);
    ContextSleeper sleeper(ctx, &sleeper_);
    bool token_retried = false;
    return RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&]() -> Status {
      if (auto s = ctx.Check(what); !s.ok()) return s;
      auto creds = creds_->Get(ctx);
      if (!creds.ok()) return Status(creds.status().code(), what + ": " + creds.status().message());
      HttpRequest req;
      req.method = "POST";
      req.url = endpoint_ + "/";
      req.timeout = std::chrono::seconds(30);
      req.body = fmt::format("Action={}&{}&Version={}", action, params, api_.version);
      req.headers = {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}};
      if (auto s = SignV4(req, *creds, i_.region, api_.service, Sha256Hex(req.body), clock_.WallNow()); !s.ok()) return s;
      auto r = http_.Send(req, ctx);
      if (!r.ok()) return Status(r.status().code(), what + ": " + r.status().message());
      if (r->status == 200) {
        if (answer) *answer = r->body;
        return OkStatus();
      }
      std::string code = output::EscapeInvalidUtf8(XmlText(r->body, "Code").value_or("").substr(0, 100));
      std::string message = output::EscapeInvalidUtf8(XmlText(r->body, "Message").value_or("").substr(0, 300));
      std::string server = fmt::format("HTTP {} {}: {}", r->status, code, message);
      if ((code == "RequestExpired" || code == "ExpiredToken") && !token_retried) {
        creds_->Invalidate();
        token_retried = true;
        return UnavailableError(fmt::format("{}: {}; fetching the credentials again", what, server));
      }
      if (code == "UnauthorizedOperation" || code == "AccessDenied" || r->status == 403) {
        return PermissionDeniedError(fmt::format("{}: {}. The credentials ({}) need {}:{} on {}", what, server,
                                                 creds_->Source(), api_.prefix, action, scope));
      }
      if (code == "AuthFailure" || code == "SignatureDoesNotMatch" || code == "InvalidClientTokenId") {
        return PermissionDeniedError(fmt::format("{}: {} refused the credentials from the {} ({})", what,
                                                 api_.service == std::string_view("ec2") ? "EC2" : "Auto Scaling",
                                                 creds_->Source(), server));
      }
      if (code == "InvalidInstanceID.NotFound") return NotFoundError(fmt::format("{}: {}", what, server));
      if (r->status >= 500 || code == "RequestLimitExceeded" || code == "Unavailable" || code == "Throttling" ||
          code == "ServiceUnavailable") {
        return UnavailableError(fmt::format("{}: {}", what, server));
      }
      return InvalidArgumentError(fmt::format("{}: {}", what, server));
    });
  }

  QueryApi api_;
  std::string endpoint_;
  Ec2InstanceRef i_;
  std::unique_ptr<AwsCredentialProvider> creds_;
  Sleeper& sleeper_;
  const Clock& clock_;
  HttpPool http_;
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

// Leaving an Auto Scaling group: TerminateInstanceInAutoScalingGroup with
// ShouldDecrementDesiredCapacity, so that the group launches nothing in its
// place. The answer is synchronous (an Activity, or a ValidationError).
class AsgClient final : public QueryClient, public GroupClient {
 public:
  AsgClient(std::string endpoint, InstanceGroup g, Ec2InstanceRef i, std::unique_ptr<AwsCredentialProvider> creds,
            Sleeper& sleeper, const Clock& clock)
      : QueryClient(kAutoScalingApi, std::move(endpoint), std::move(i), std::move(creds), sleeper, clock),
        g_(std::move(g)) {}

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
  Status Leave(const CallContext& ctx) override {
    auto s = Call("TerminateInstanceInAutoScalingGroup",
                  fmt::format("InstanceId={}&ShouldDecrementDesiredCapacity=true", AwsUriEncode(i_.instance_id, false)),
                  fmt::format("leave {} with this instance ({})", g_.Describe(), i_.instance_id),
                  fmt::format("the group {}", g_.name), ctx);
    // A terminating lifecycle hook now holds the instance in
    // Terminating:Wait, billed, for nothing: the run is over and synced.
    // Best effort (a hook that has not caught the instance yet answers a
    // ValidationError, and its heartbeat timeout ends the wait).
    if (s.ok()) (void)CompleteTermination(ctx, nullptr);
    return s;
  }

 private:
  InstanceGroup g_;
};

std::string Endpoint(std::string endpoint, std::initializer_list<const char*> env, const std::string& fallback) {
  for (const char* name : env) {
    if (endpoint.empty()) endpoint = Env(name);
  }
  if (endpoint.empty()) endpoint = fallback;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

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
  endpoint = Endpoint(std::move(endpoint), {"AWS_ENDPOINT_URL_EC2", "AWS_ENDPOINT_URL"},
                      fmt::format("https://ec2.{}.amazonaws.com", instance.region));
  return std::make_unique<Ec2Client>(kEc2Api, std::move(endpoint), std::move(instance), std::move(credentials), sleeper,
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
  endpoint = Endpoint(std::move(endpoint), {"AWS_ENDPOINT_URL_AUTO_SCALING", "AWS_ENDPOINT_URL"},
                      fmt::format("https://autoscaling.{}.amazonaws.com", instance.region));
  return std::make_unique<AsgClient>(std::move(endpoint), std::move(group), std::move(instance), std::move(credentials),
                                     sleeper, clock);
}

}  // namespace spotvisor
