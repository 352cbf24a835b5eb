#include "storage/aws_credentials.h"

#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "log/logger.h"
#include "output/utf8.h"

namespace spotvisor {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A credential goes into a header: nothing that could break one.
bool HeaderSafe(const std::string& s) {
  if (s.empty() || s.size() > 8192) return false;
  for (unsigned char c : s) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<AwsCredentialProvider>> AwsCredentialsFromEnv() {
  AwsCredentials c{Env("AWS_ACCESS_KEY_ID"), Env("AWS_SECRET_ACCESS_KEY"), Env("AWS_SESSION_TOKEN")};
  if (c.access_key_id.empty()) return std::unique_ptr<AwsCredentialProvider>();
  if (c.secret_access_key.empty()) {
    return InvalidArgumentError("AWS_ACCESS_KEY_ID is set but AWS_SECRET_ACCESS_KEY is not");
  }
  if (!HeaderSafe(c.access_key_id) || !HeaderSafe(c.secret_access_key) ||
      (!c.session_token.empty() && !HeaderSafe(c.session_token))) {
    return InvalidArgumentError("AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY or AWS_SESSION_TOKEN holds a space or a "
                                "control character: not a key");
  }
  return std::unique_ptr<AwsCredentialProvider>(std::make_unique<StaticAwsCredentials>(std::move(c), "environment"));
}

StatusOr<AwsCredentials> ParseRoleCredentials(std::string_view body, WallTime* expiration) {
  auto j = nlohmann::json::parse(body, nullptr, false);
  if (!j.is_object()) return UnavailableError("instance role credentials: not a JSON object");
  auto str = [&](const char* key) -> std::string {
    auto it = j.find(key);
    return it != j.end() && it->is_string() ? it->get<std::string>() : "";
  };
  std::string code = str("Code");
  if (!code.empty() && code != "Success") {
    return UnavailableError(fmt::format("instance role credentials: Code \"{}\"", output::EscapeInvalidUtf8(code.substr(0, 100))));
  }
  AwsCredentials c{str("AccessKeyId"), str("SecretAccessKey"), str("Token")};
  if (!HeaderSafe(c.access_key_id) || !HeaderSafe(c.secret_access_key) || (!c.session_token.empty() && !HeaderSafe(c.session_token))) {
    return UnavailableError("instance role credentials: AccessKeyId, SecretAccessKey or Token missing or malformed");
  }
  auto exp = ParseRfc3339(str("Expiration"));
  if (!exp) return UnavailableError("instance role credentials: no valid Expiration");
  if (expiration) *expiration = *exp;
  return c;
}

StatusOr<AwsCredentials> InstanceRoleCredentials::Get(const CallContext& ctx) {
  std::lock_guard lk(mu_);
  if (!creds_.access_key_id.empty() && clock_.WallNow() < refresh_at_) return creds_;
  if (role_.empty()) {
    auto roles = imds_->Get("meta-data/iam/security-credentials/", ctx);
    if (!roles.ok()) {
      if (roles.status().code() == StatusCode::kNotFound) {
        return FailedPreconditionError("no AWS credentials: AWS_ACCESS_KEY_ID is not set and this instance has no IAM "
                                       "role (attach an instance profile with s3:GetObject, s3:PutObject, s3:ListBucket, "
                                       "s3:DeleteObject on the bucket)");
      }
      return Status(roles.status().code(), "no AWS credentials: AWS_ACCESS_KEY_ID is not set and the instance role could "
                                           "not be read: " + roles.status().message());
    }
    auto lines = SplitLines(*roles);
    if (lines.empty() || Trim(lines[0]).empty() || lines[0].find('/') != std::string::npos) {
      return UnavailableError("instance role: the metadata service listed no role name");
    }
    role_ = std::string(Trim(lines[0]));
  }
  auto body = imds_->Get("meta-data/iam/security-credentials/" + role_, ctx);
  if (!body.ok()) return Status(body.status().code(), fmt::format("instance role {}: {}", role_, body.status().message()));
  WallTime exp{};
  auto c = ParseRoleCredentials(*body, &exp);
  if (!c.ok()) return c.status();
  creds_ = *c;
  // Five minutes ahead, as the SDKs do; credentials closer to their end than
  // that are used, and asked for again next time.
  refresh_at_ = exp - std::chrono::minutes(5);
  return creds_;
}

void InstanceRoleCredentials::Invalidate() {
  std::lock_guard lk(mu_);
  creds_ = {};
}

std::string InstanceRoleCredentials::Source() const {
  std::lock_guard lk(mu_);
  return role_.empty() ? "instance role" : "instance role " + role_;
}

StatusOr<std::unique_ptr<AwsCredentialProvider>> DefaultAwsCredentials(const Clock& clock) {
  auto env = AwsCredentialsFromEnv();
  if (!env.ok()) return env.status();
  if (*env) return std::move(*env);
  return std::unique_ptr<AwsCredentialProvider>(
      std::make_unique<InstanceRoleCredentials>(MakeImdsClient(ImdsOptions{}, clock), clock));
}

}  // namespace spotvisor
