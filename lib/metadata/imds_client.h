// The EC2 instance metadata service, version 2 only (IMDSv1 is off on a
// well-configured instance): a session token from PUT /latest/api/token,
// sent on every read as X-aws-ec2-metadata-token, fetched again before it
// expires and after a 401. AWS_EC2_METADATA_SERVICE_ENDPOINT (the AWS
// SDKs' name) overrides http://169.254.169.254.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "http/http_client.h"

namespace spotvisor {

class ImdsClient {
 public:
  virtual ~ImdsClient() = default;
  // GET /latest/PATH (e.g. "meta-data/spot/instance-action"). 404 is
  // kNotFound (no such value, e.g. no notice yet). Bounded by `ctx`.
  virtual StatusOr<std::string> Get(const std::string& path, const CallContext& ctx) = 0;
  // "http://169.254.169.254", for messages.
  virtual std::string Endpoint() const = 0;
};

struct ImdsOptions {
  std::string endpoint;  // empty: AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254
  std::chrono::seconds token_ttl{21600};
  // Short: off EC2 nothing answers at 169.254.169.254.
  std::chrono::milliseconds connect_timeout{1'000};
  std::chrono::milliseconds timeout{5'000};
  std::function<std::unique_ptr<HttpClient>()> make_http = MakeCurlHttpClient;
};

std::string ImdsEndpointFromEnv();

std::unique_ptr<ImdsClient> MakeImdsClient(ImdsOptions options, const Clock& clock);

}  // namespace spotvisor
