// Where AWS credentials come from, in the order the AWS SDKs look: the
// environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN),
// then the instance role through the EC2 metadata service
// (iam/security-credentials/ROLE), refreshed five minutes before its
// Expiration. Keys are never logged or put in an error message.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "metadata/imds_client.h"
#include "storage/sigv4.h"

namespace spotvisor {

class AwsCredentialProvider {
 public:
  virtual ~AwsCredentialProvider() = default;
  virtual StatusOr<AwsCredentials> Get(const CallContext& ctx) = 0;
  // After a request was refused for its credentials (an expired token):
  // fetch afresh on the next Get.
  virtual void Invalidate() {}
  // "environment", "instance role NAME", for messages.
  virtual std::string Source() const = 0;
};

class StaticAwsCredentials final : public AwsCredentialProvider {
 public:
  StaticAwsCredentials(AwsCredentials c, std::string source) : c_(std::move(c)), source_(std::move(source)) {}
  StatusOr<AwsCredentials> Get(const CallContext&) override { return c_; }
  std::string Source() const override { return source_; }

 private:
  AwsCredentials c_;
  std::string source_;
};

// Every Get fails with `why` (a malformed key in the environment).
class FailingAwsCredentials final : public AwsCredentialProvider {
 public:
  explicit FailingAwsCredentials(Status why) : why_(std::move(why)) {}
  StatusOr<AwsCredentials> Get(const CallContext&) override { return why_; }
  std::string Source() const override { return "environment"; }

 private:
  Status why_;
};

// The environment's keys, or nullptr when AWS_ACCESS_KEY_ID is unset; a key
// id without a secret is kInvalidArgument.
StatusOr<std::unique_ptr<AwsCredentialProvider>> AwsCredentialsFromEnv();

class InstanceRoleCredentials final : public AwsCredentialProvider {
 public:
  InstanceRoleCredentials(std::unique_ptr<ImdsClient> imds, const Clock& clock) : imds_(std::move(imds)), clock_(clock) {}
  StatusOr<AwsCredentials> Get(const CallContext& ctx) override;
  void Invalidate() override;
  std::string Source() const override;

 private:
  std::unique_ptr<ImdsClient> imds_;
  const Clock& clock_;
  mutable std::mutex mu_;
  std::string role_;
  AwsCredentials creds_;
  WallTime refresh_at_{};
};

// The body of iam/security-credentials/ROLE, checked: never throws.
// `expiration` is set from its Expiration.
StatusOr<AwsCredentials> ParseRoleCredentials(std::string_view body, WallTime* expiration);

// The environment's keys if set, else the instance role.
StatusOr<std::unique_ptr<AwsCredentialProvider>> DefaultAwsCredentials(const Clock& clock);

}  // namespace spotvisor
