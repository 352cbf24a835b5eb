// The GCE metadata server, as google-guest-agent models it: plain reads, and
// long-polls that hang until a value changes. Paths are relative to
// /computeMetadata/v1/ (e.g. "instance/preempted").
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "common/cancel.h"
#include "common/status.h"
#include "http/http_client.h"

namespace spotvisor {

struct MetadataValue {
  std::string value;
  std::string etag;
};

class MetadataClient {
 public:
  virtual ~MetadataClient() = default;
  // 404 (key not defined) is kNotFound, the one answer never worth retrying.
  // The request's timeout is clamped to what `ctx` has left, and cancelling
  // `ctx` cuts it short.
  virtual StatusOr<MetadataValue> Get(const std::string& path, const CallContext& ctx) = 0;
  StatusOr<MetadataValue> Get(const std::string& path) { return Get(path, Background()); }
  // Long-poll: answers at once when `last_etag` is stale, otherwise when the
  // value changes or after `timeout` with the unchanged value.
  virtual StatusOr<MetadataValue> Watch(const std::string& path, const std::string& last_etag,
                                        std::chrono::seconds timeout) = 0;
  // Custom metadata of a directory such as "instance/attributes/". A 404 or
  // an empty answer is an empty directory; an answer that is not a JSON
  // object is kFailedPrecondition (see ParseAttributes).
  virtual StatusOr<std::map<std::string, std::string>> GetAttributes(const std::string& dir) = 0;
  // PUT instance/guest-attributes/NAMESPACE/KEY: readable from outside the
  // VM with `gcloud compute instances get-guest-attributes`.
  virtual Status PutGuestAttribute(const std::string& ns_key, const std::string& value) = 0;
  // Thread-safe: aborts an outstanding request (used at shutdown).
  virtual void Cancel() = 0;
};

struct MetadataEndpoint {
  std::string host = "169.254.169.254";  // host[:port]
  // How long to wait for a TCP connection: short where the server may simply
  // not exist (spotvisor run off GCE).
  std::chrono::milliseconds connect_timeout{5'000};
};

// GCE_METADATA_HOST (host[:port], as Google's client libraries read it)
// overrides the default address.
MetadataEndpoint MetadataEndpointFromEnv();

// The HTTP timeout for a long-poll of `timeout`: the hang timeout plus a
// margin (guest agent: 60 s + 10 s), so a server that never answers is
// noticed without cutting off one that answers on time.
std::chrono::milliseconds LongPollHttpTimeout(std::chrono::seconds timeout);

// The body of GET DIR?recursive=true, checked: never throws, whatever the
// bytes. Non-string values are kept as their JSON text. `where` names the
// directory in errors.
StatusOr<std::map<std::string, std::string>> ParseAttributes(std::string_view body, const std::string& where);

// The deepest nesting of [ and { outside JSON strings, counting stopped once
// past `limit`: a check to make before nlohmann's recursive dump().
int JsonNestingDepth(std::string_view text, int limit);
inline constexpr int kMaxAttributeDepth = 32;

// `make_http`: a client per cancellable call (a cancelled HttpClient stays
// cancelled); without it, such calls are only bounded by their deadline.
std::unique_ptr<MetadataClient> MakeMetadataClient(MetadataEndpoint endpoint, std::unique_ptr<HttpClient> http,
                                                   std::function<std::unique_ptr<HttpClient>()> make_http = {});

}  // namespace spotvisor
