// One AWS Query API (EC2's, Auto Scaling's): a form POST of Action=...&
// parameters, signed with SigV4, answered in XML. What the instance's own
// calls (ec2_client.h) and `spotvisor launch` on a laptop share: the
// signing, the brief retries, and errors that name the action, the
// permission it needs and where the credentials came from.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "retry/sleeper.h"
#include "storage/aws_credentials.h"
#include "storage/transfer.h"

namespace spotvisor {

struct AwsQueryApi {
  const char* service;  // SigV4's service name
  const char* version;
  const char* prefix;   // of the IAM action, "ec2" / "autoscaling"
  const char* title;    // "EC2", for messages
};
inline constexpr AwsQueryApi kEc2QueryApi{"ec2", "2016-11-15", "ec2", "EC2"};
inline constexpr AwsQueryApi kAutoScalingQueryApi{"autoscaling", "2011-01-01", "autoscaling", "Auto Scaling"};

class AwsQueryClient {
 public:
  AwsQueryClient(AwsQueryApi api, std::string endpoint, std::string region,
                 std::unique_ptr<AwsCredentialProvider> creds, Sleeper& sleeper, const Clock& clock);

  // One action. `params` follow "Action=ACTION&" (already encoded, "" for
  // none); `what` names the call in errors, `scope` what the permission is
  // needed on. An idempotent action (stopping a stopping instance, leaving a
  // group already left, a create with a ClientToken) is tried again on a
  // transient failure (transport, 5xx, throttling, an expired token once),
  // three times in all within ctx; one that is not gets one try. The codes:
  //   kPermissionDenied    UnauthorizedOperation / AccessDenied / a refused key
  //   kNotFound            *.NotFound, *NotFoundException
  //   kFailedPrecondition  *AlreadyExists* (the name is taken)
  //   kUnavailable         still failing after the retries
  //   kInvalidArgument     anything else the API refused (ValidationError, ...)
  // `answer` gets the body of a 200.
  Status Call(const char* action, const std::string& params, const std::string& what, const std::string& scope,
              const CallContext& ctx, std::string* answer = nullptr, bool idempotent = true);

  // The server's error code of the last refused call ("" none), for callers
  // that tell one ValidationError from another.
  const std::string& last_code() const { return last_code_; }
  const AwsCredentialProvider& credentials() const { return *creds_; }

 private:
  AwsQueryApi api_;
  std::string endpoint_;
  std::string region_;
  std::unique_ptr<AwsCredentialProvider> creds_;
  Sleeper& sleeper_;
  const Clock& clock_;
  HttpPool http_;
  std::string last_code_;
};

// `explicit_endpoint` if set, else the first environment variable of `env`
// that is set, else `fallback`; without a trailing '/'.
std::string AwsEndpoint(std::string explicit_endpoint, std::initializer_list<const char*> env, const std::string& fallback);

}  // namespace spotvisor
