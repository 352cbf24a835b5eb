#include "compute/aws_query.h"

#include <cstdlib>

#include <fmt/format.h>

#include "output/utf8.h"
#include "retry/retry_loop.h"
#include "storage/s3_xml.h"
#include "storage/sigv4.h"

namespace spotvisor {

AwsQueryClient::AwsQueryClient(AwsQueryApi api, std::string endpoint, std::string region,
                               std::unique_ptr<AwsCredentialProvider> creds, Sleeper& sleeper, const Clock& clock)
    : api_(api), endpoint_(std::move(endpoint)), region_(std::move(region)), creds_(std::move(creds)),
      sleeper_(sleeper), clock_(clock), http_(MakeCurlHttpClient) {}

Status AwsQueryClient::Call(const char* action, const std::string& params, const std::string& what,
                            const std::string& scope, const CallContext& ctx, std::string* answer, bool idempotent) {
  LimitedErrorCountRetryPolicy retry(3);
  ExponentialBackoffPolicy backoff(std::chrono::milliseconds(500), std::chrono::seconds(4), 2.0);
  ContextSleeper sleeper(ctx, &sleeper_);
  bool token_retried = false;
  last_code_.clear();
  return RetryLoop(retry, backoff, idempotent ? Idempotency::kIdempotent : Idempotency::kNonIdempotent, sleeper,
                   [&]() -> Status {
    last_code_.clear();  // the code of this attempt, not of one before it
    if (auto s = ctx.Check(what); !s.ok()) return s;
    auto creds = creds_->Get(ctx);
    if (!creds.ok()) return Status(creds.status().code(), what + ": " + creds.status().message());
    HttpRequest req;
    req.method = "POST";
    req.url = endpoint_ + "/";
    req.timeout = std::chrono::seconds(30);
    req.body = params.empty() ? fmt::format("Action={}&Version={}", action, api_.version)
                              : fmt::format("Action={}&{}&Version={}", action, params, api_.version);
    req.headers = {{"Content-Type", "application/x-www-form-urlencoded; charset=utf-8"}};
    if (auto s = SignV4(req, *creds, region_, api_.service, Sha256Hex(req.body), clock_.WallNow()); !s.ok()) return s;
    auto r = http_.Send(req, ctx);
    if (!r.ok()) return Status(r.status().code(), what + ": " + r.status().message());
    if (r->status == 200) {
      if (answer) *answer = r->body;
      return OkStatus();
    }
    std::string code = output::EscapeInvalidUtf8(XmlText(r->body, "Code").value_or("").substr(0, 100));
    std::string message = output::EscapeInvalidUtf8(XmlText(r->body, "Message").value_or("").substr(0, 300));
    last_code_ = code;
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
      return PermissionDeniedError(
          fmt::format("{}: {} refused the credentials from the {} ({})", what, api_.title, creds_->Source(), server));
    }
    // By the code's family (InvalidInstanceID.NotFound,
    // InvalidLaunchTemplateName.NotFoundException, ...): a caller that must
    // tell one missing thing from another looks at last_code().
    if (code.find("NotFound") != std::string::npos) return NotFoundError(fmt::format("{}: {}", what, server));
    if (code.find("AlreadyExists") != std::string::npos) {
      return FailedPreconditionError(fmt::format("{}: {}", what, server));
    }
    if (r->status >= 500 || code == "RequestLimitExceeded" || code == "Unavailable" || code == "Throttling" ||
        code == "ServiceUnavailable" || code == "InternalError" || code == "InternalFailure") {
      return UnavailableError(fmt::format("{}: {}", what, server));
    }
    return InvalidArgumentError(fmt::format("{}: {}", what, server));
  });
}

std::string AwsEndpoint(std::string endpoint, std::initializer_list<const char*> env, const std::string& fallback) {
  for (const char* name : env) {
    const char* v = std::getenv(name);
    if (endpoint.empty() && v != nullptr) endpoint = v;
  }
  if (endpoint.empty()) endpoint = fallback;
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  return endpoint;
}

}  // namespace spotvisor
