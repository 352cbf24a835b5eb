// A thin RAII wrapper over libcurl for blocking requests made off the event
// loop. Each instance owns one easy handle inside one multi handle, so a
// request can be cut short from another thread (Cancel) without waiting for
// its timeout: a 70 s metadata long-poll must not delay shutdown.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <string_view>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace spotvisor {

struct HttpRequest {
  std::string method = "GET";
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // When set, the body is these bytes instead of `body`, borrowed: they
  // must outlive Perform. An upload's part goes out of the buffer it was
  // read into, not through a copy of it.
  std::string_view borrowed_body;
  std::string_view Body() const { return borrowed_body.data() != nullptr ? borrowed_body : std::string_view(body); }
  std::chrono::milliseconds timeout{30'000};
  std::chrono::milliseconds connect_timeout{5'000};
  // When set, a 2xx response body is handed over in pieces instead of being
  // kept in HttpResponse::body (downloads of large objects). Returning false
  // aborts the transfer. Error bodies are always kept, for messages.
  std::function<bool(std::string_view)> on_body;
  // Abort if slower than this many bytes/s for 30 s (0: off); a stalled
  // connection must fail, not hang until `timeout`.
  long low_speed_limit = 0;
  // TLS for https URLs (PEM files; empty: libcurl's defaults, the system's
  // CAs and no client certificate). A private CA and a client certificate
  // are how a self-hosted etcd is secured.
  std::string ca_file;
  std::string cert_file;
  std::string key_file;
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;

  std::string Header(const std::string& lower_name) const;
};

class HttpClient {
 public:
  virtual ~HttpClient() = default;
  // Transport failures are Status (kUnavailable, kDeadlineExceeded,
  // kCancelled); any HTTP status, even 500, is a response.
  virtual StatusOr<HttpResponse> Perform(const HttpRequest& request) = 0;
  // Thread-safe: aborts the current request and every later one.
  virtual void Cancel() = 0;
};

std::unique_ptr<HttpClient> MakeCurlHttpClient();

}  // namespace spotvisor
