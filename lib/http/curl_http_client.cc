#include <curl/curl.h>

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <mutex>

#include <fmt/format.h>

#include "common/strings.h"
#include "http/http_client.h"

namespace spotvisor {
namespace {

constexpr int kPollCapMs = 3'600'000;

void GlobalInitOnce() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

using EasyPtr = std::unique_ptr<CURL, decltype(&curl_easy_cleanup)>;
using MultiPtr = std::unique_ptr<CURLM, decltype(&curl_multi_cleanup)>;
using SlistPtr = std::unique_ptr<curl_slist, decltype(&curl_slist_free_all)>;

struct BodyTarget {
  HttpResponse* response;
  const HttpRequest* request;
};

std::size_t OnBody(char* data, std::size_t size, std::size_t n, void* user) {
  auto* t = static_cast<BodyTarget*>(user);
  // OnHeader parsed the status line before any body byte arrives.
  if (t->request->on_body && t->response->status / 100 == 2) {
    return t->request->on_body(std::string_view(data, size * n)) ? size * n : 0;
  }
  t->response->body.append(data, size * n);
  return size * n;
}

std::size_t OnHeader(char* data, std::size_t size, std::size_t n, void* user) {
  std::string_view line(data, size * n);
  auto colon = line.find(':');
  if (colon != std::string_view::npos) {
    std::string name(Trim(line.substr(0, colon)));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    // A repeated header is one list (RFC 9110 section 5.3): Cloud Storage
    // sends x-goog-hash twice, crc32c= and md5=, and neither may be lost.
    auto value = std::string(Trim(line.substr(colon + 1)));
    auto& headers = static_cast<HttpResponse*>(user)->headers;
    auto [it, inserted] = headers.emplace(std::move(name), value);
    if (!inserted) it->second += ", " + value;
  } else if (StartsWith(line, "HTTP/")) {
    // A new status line (after a redirect or 100-continue) starts afresh.
    auto* r = static_cast<HttpResponse*>(user);
    r->headers.clear();
    auto sp = line.find(' ');
    r->status = sp == std::string_view::npos ? 0 : std::atol(std::string(line.substr(sp + 1, 3)).c_str());
  }
  return size * n;
}

Status FromCurl(CURLcode code, const std::string& url, const char* detail) {
  std::string msg = fmt::format("{} {}: {}", url, curl_easy_strerror(code),
                                (detail && *detail) ? detail : "");
  switch (code) {
    case CURLE_OPERATION_TIMEDOUT: return DeadlineExceededError(std::move(msg));
    case CURLE_URL_MALFORMAT:
    case CURLE_UNSUPPORTED_PROTOCOL: return InvalidArgumentError(std::move(msg));
    default: return UnavailableError(std::move(msg));
  }
}

class CurlHttpClient final : public HttpClient {
 public:
  CurlHttpClient() : easy_(curl_easy_init(), &curl_easy_cleanup), multi_(curl_multi_init(), &curl_multi_cleanup) {}

  StatusOr<HttpResponse> Perform(const HttpRequest& request) override {
    if (cancelled_.load()) return CancelledError(request.url + ": cancelled");
    if (!easy_ || !multi_) return InternalError("curl handles could not be created");
    CURL* h = easy_.get();
    curl_easy_reset(h);
    HttpResponse response;
    SlistPtr headers(nullptr, &curl_slist_free_all);
    for (auto const& [k, v] : request.headers) {
      headers.reset(curl_slist_append(headers.release(), (k + ": " + v).c_str()));
    }
    // "Expect: 100-continue" would add a round trip to every upload.
    headers.reset(curl_slist_append(headers.release(), "Expect:"));
    char error[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    if (request.method == "HEAD") curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    if (!request.Body().empty() || request.method == "POST" || request.method == "PUT") {
      // Not CURLOPT_COPYPOSTFIELDS: the bytes are sent from where they are.
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.Body().data());
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.Body().size()));
    }
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
    BodyTarget target{&response, &request};
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &OnBody);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &target);
    // A streamed body (a download) comes in pieces of up to this: 256 KiB
    // instead of libcurl's 16 KiB default, 16 times fewer callbacks and
    // reads. Only for these: curl_easy_reset puts it back for the rest.
    if (request.on_body) curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 256L << 10);
    if (request.low_speed_limit > 0) {
      curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, request.low_speed_limit);
      curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 30L);
    }
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &OnHeader);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &response);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout.count()));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout.count()));
    // The metadata server must never be reached through a proxy.
    curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
    if (!request.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, request.ca_file.c_str());
    if (!request.cert_file.empty()) curl_easy_setopt(h, CURLOPT_SSLCERT, request.cert_file.c_str());
    if (!request.key_file.empty()) curl_easy_setopt(h, CURLOPT_SSLKEY, request.key_file.c_str());

    curl_multi_add_handle(multi_.get(), h);
    CURLcode result = CURLE_OK;
    bool done = false;
    while (!done) {
      int running = 0;
      if (curl_multi_perform(multi_.get(), &running) != CURLM_OK) {
        result = CURLE_FAILED_INIT;
        break;
      }
      int queued = 0;
      while (CURLMsg* m = curl_multi_info_read(multi_.get(), &queued)) {
        if (m->msg == CURLMSG_DONE) {
          result = m->data.result;
          done = true;
        }
      }
      if (done) break;
      if (cancelled_.load()) {
        curl_multi_remove_handle(multi_.get(), h);
        return CancelledError(request.url + ": cancelled");
      }
      // No periodic wakeup: libcurl shortens the wait to its own next timer
      // (the request's timeouts, a connect attempt), and Cancel() wakes it
      // with curl_multi_wakeup. A parked long-poll costs nothing while idle
      // (issue #15: it woke every second). The cap is a last resort only.
      curl_multi_poll(multi_.get(), nullptr, 0, kPollCapMs, nullptr);
    }
    curl_multi_remove_handle(multi_.get(), h);
    if (result != CURLE_OK) return FromCurl(result, request.url, error);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &response.status);
    return response;
  }

  void Cancel() override {
    cancelled_.store(true);
    if (multi_) curl_multi_wakeup(multi_.get());
  }

 private:
  EasyPtr easy_;
  MultiPtr multi_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

std::string HttpResponse::Header(const std::string& lower_name) const {
  auto it = headers.find(lower_name);
  return it == headers.end() ? std::string() : it->second;
}

std::unique_ptr<HttpClient> MakeCurlHttpClient() {
  GlobalInitOnce();
  return std::make_unique<CurlHttpClient>();
}

}  // namespace spotvisor
