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

class Ec2Client final : public ComputeClient, public Ec2Tagger {
 public:
  Ec2Client(std::string endpoint, Ec2InstanceRef i, std::unique_ptr<AwsCredentialProvider> creds, Sleeper& sleeper,
            const Clock& clock)
      : endpoint_(std::move(endpoint)), i_(std::move(i)), creds_(std::move(creds)), sleeper_(sleeper), clock_(clock),
        http_(MakeCurlHttpClient) {}

  Status StopInstance(const CallContext& ctx) override { return Call("StopInstances", "stop", "", ctx); }
  Status DeleteInstance(const CallContext& ctx) override { return Call("TerminateInstances", "terminate", "", ctx); }
  // Setting a tag to the value it has changes nothing: idempotent too.
  Status SetTag(const std::string& key, const std::string& value, const CallContext& ctx) override {
    return Call("CreateTags", "tag", fmt::format("&Tag.1.Key={}&Tag.1.Value={}", AwsUriEncode(key, false),
                                                 AwsUriEncode(value.substr(0, 256), false)),
                ctx);
  }

 private:
  // Both actions are idempotent (stopping a stopping instance, terminating a
  // terminated one, changes nothing), so transient failures are retried,
  // briefly: if the API stays unreachable the caller powers off instead.
  Status Call(const char* action, const char* verb, const std::string& extra, const CallContext& ctx) {
    LimitedErrorCountRetryPolicy retry(3);
    ExponentialBackoffPolicy backoff(std::chrono::milliseconds(500), std::chrono::seconds(4), 2.0);
    ContextSleeper sleeper(ctx, &sleeper_);
    std::string what = fmt::format("{} instance {} ({})", verb, i_.instance_id, i_.region);
    bool token_retried = false;
    return RetryLoop(retry, backoff, Idempotency::kIdempotent, sleeper, [&]() -> Status {
      if (auto s = ctx.Check(what); !s.ok()) return s;
      auto creds = creds_->Get(ctx);
      if (!creds.ok()) return Status(creds.status().code(), what + ": " + creds.status().message());
      HttpRequest req;
      req.method = "POST";
      req.url = endpoint_ + "/";
      req.timeout = std::chrono::seconds(30);
      // CreateTags names its instance as a resource; the others as an instance.
      req.body = fmt::format("Action={}&{}.1={}{}&Version={}", action,
                             std::string_view(action) == "CreateTags" ? "ResourceId" : "InstanceId",
                             AwsUriEncode(i_.instance_id, false), extra, kApiVersion);
      req.headers = {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}};
      if (auto s = SignV4(req, *creds, i_.region, "ec2", Sha256Hex(req.body), clock_.WallNow()); !s.ok()) return s;
      auto r = http_.Send(req, ctx);
      if (!r.ok()) return Status(r.status().code(), what + ": " + r.status().message());
      if (r->status == 200) return OkStatus();
      std::string code = output::EscapeInvalidUtf8(XmlText(r->body, "Code").value_or("").substr(0, 100));
      std::string message = output::EscapeInvalidUtf8(XmlText(r->body, "Message").value_or("").substr(0, 300));
      std::string server = fmt::format("HTTP {} {}: {}", r->status, code, message);
      if ((code == "RequestExpired" || code == "ExpiredToken") && !token_retried) {
        creds_->Invalidate();
        token_retried = true;
        return UnavailableError(fmt::format("{}: {}; fetching the credentials again", what, server));
      }
      if (code == "UnauthorizedOperation" || r->status == 403) {
        return PermissionDeniedError(fmt::format("{}: {}. The credentials ({}) need ec2:{} on this instance", what,
                                                 server, creds_->Source(), action));
      }
      if (code == "AuthFailure" || code == "SignatureDoesNotMatch") {
        return PermissionDeniedError(fmt::format("{}: EC2 refused the credentials from the {} ({})", what,
                                                 creds_->Source(), server));
      }
      if (code == "InvalidInstanceID.NotFound") return NotFoundError(fmt::format("{}: {}", what, server));
      if (r->status >= 500 || code == "RequestLimitExceeded" || code == "Unavailable") {
        return UnavailableError(fmt::format("{}: {}", what, server));
      }
      return InvalidArgumentError(fmt::format("{}: {}", what, server));
    });
  }

  std::string endpoint_;
  Ec2InstanceRef i_;
  std::unique_ptr<AwsCredentialProvider> creds_;
  Sleeper& sleeper_;
  const Clock& clock_;
  HttpPool http_;
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
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL_EC2");
  if (endpoint.empty()) endpoint = Env("AWS_ENDPOINT_URL");
  if (endpoint.empty()) endpoint = fmt::format("https://ec2.{}.amazonaws.com", instance.region);
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return std::make_unique<Ec2Client>(std::move(endpoint), std::move(instance), std::move(credentials), sleeper, clock);
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

}  // namespace spotvisor
