#include "metadata/metadata_client.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "output/utf8.h"

namespace spotvisor {
namespace {


class MetadataClientImpl final : public MetadataClient {
 public:
  MetadataClientImpl(MetadataEndpoint endpoint, std::unique_ptr<HttpClient> http,
                     std::function<std::unique_ptr<HttpClient>()> make_http)
      : endpoint_(std::move(endpoint)), http_(std::move(http)), make_http_(std::move(make_http)) {}

  using MetadataClient::Get;
  StatusOr<MetadataValue> Get(const std::string& path, const CallContext& ctx) override {
    if (auto s = ctx.Check("metadata " + path); !s.ok()) return s;
    std::chrono::milliseconds timeout{10'000};
    if (ctx.deadline) {
      timeout = ctx.Remaining(timeout);
      if (timeout.count() <= 0) return DeadlineExceededError("metadata " + path + ": out of time");
    }
    if (!ctx.cancel || !make_http_) return Fetch(*http_, path, "", timeout);
    std::shared_ptr<HttpClient> http(make_http_());
    auto sub = ctx.cancel->Subscribe([http] { http->Cancel(); });
    auto r = Fetch(*http, path, "", timeout);
    ctx.cancel->Unsubscribe(sub);
    return r;
  }

  StatusOr<MetadataValue> Watch(const std::string& path, const std::string& last_etag,
                                std::chrono::seconds timeout) override {
    std::string query = fmt::format("wait_for_change=true&timeout_sec={}", timeout.count());
    // Escaped: an ETag is whatever the server sent, and one with a space or
    // '&' in it would make every later URL malformed (the ETag only
    // advances on success, so the watcher would never recover).
    if (!last_etag.empty()) query += "&last_etag=" + UrlEncode(last_etag);
    return Fetch(*http_, path, query, LongPollHttpTimeout(timeout));
  }

  StatusOr<std::map<std::string, std::string>> GetAttributes(const std::string& dir) override {
    auto r = Fetch(*http_, dir, "recursive=true", std::chrono::milliseconds(10'000));
    // Not every metadata server answers {} for a directory with nothing in
    // it; some answer 404. The directory is still there to be asked about,
    // so it is empty, not a missing key to stop for.
    if (!r.ok() && r.status().code() == StatusCode::kNotFound) return std::map<std::string, std::string>{};
    if (!r.ok()) return r.status();
    return ParseAttributes(r->value, "metadata " + dir);
  }

  Status PutGuestAttribute(const std::string& ns_key, const std::string& value) override {
    HttpRequest req;
    req.method = "PUT";
    req.url = fmt::format("http://{}/computeMetadata/v1/instance/guest-attributes/{}", endpoint_.host, ns_key);
    req.headers = {{"Metadata-Flavor", "Google"}};
    req.body = value;
    req.timeout = std::chrono::seconds(10);
    req.connect_timeout = endpoint_.connect_timeout;
    auto r = http_->Perform(req);
    if (!r.ok()) return r.status();
    if (r->status == 200) return OkStatus();
    auto what = "guest attribute " + ns_key;
    if (r->status == 403) return PermissionDeniedError(what + ": forbidden (HTTP 403); guest attributes may be disabled (enable-guest-attributes=TRUE)");
    if (r->status == 404) return NotFoundError(what + ": not found (HTTP 404); guest attributes are disabled on this VM");
    return UnavailableError(fmt::format("{}: HTTP {}", what, r->status));
  }

  void Cancel() override { http_->Cancel(); }

 private:
  StatusOr<MetadataValue> Fetch(HttpClient& http, const std::string& path, const std::string& query,
                                std::chrono::milliseconds timeout) {
    HttpRequest req;
    req.url = fmt::format("http://{}/computeMetadata/v1/{}", endpoint_.host, path);
    // A path may carry its own query (instance/upcoming-maintenance?alt=json).
    if (!query.empty()) req.url += (path.find('?') == std::string::npos ? "?" : "&") + query;
    req.headers = {{"Metadata-Flavor", "Google"}};
    req.timeout = timeout;
    req.connect_timeout = std::min(endpoint_.connect_timeout, timeout);
    auto r = http.Perform(req);
    if (!r.ok()) return r.status();
    // Anything else answering on that address (a captive portal, a proxy, a
    // misdirected GCE_METADATA_HOST) must not be believed.
    if (r->Header("metadata-flavor") != "Google") {
      return UnavailableError(fmt::format(
          "metadata {}: HTTP {} response lacks \"Metadata-Flavor: Google\"; is {} really a metadata server?",
          path, r->status, endpoint_.host));
    }
    auto where = fmt::format("metadata {}", path);
    switch (r->status) {
      case 200: return MetadataValue{std::move(r->body), r->Header("etag")};
      case 404: return NotFoundError(where + ": not defined (HTTP 404)");
      case 400: return InvalidArgumentError(where + ": bad request (HTTP 400): " + r->body);
      case 403: return PermissionDeniedError(where + ": forbidden (HTTP 403): " + r->body);
      default: {
        // The body may say why (a 503 "no notifications have been received
        // yet" is how some servers say nothing is scheduled); quoted short.
        auto body = std::string_view(r->body).substr(0, output::Utf8SafePrefixLength(r->body, 200));
        return UnavailableError(fmt::format("{}: HTTP {}{}", where, r->status,
                                            body.empty() ? "" : ": " + output::EscapeInvalidUtf8(body)));
      }
    }
  }

  MetadataEndpoint endpoint_;
  std::unique_ptr<HttpClient> http_;
  std::function<std::unique_ptr<HttpClient>()> make_http_;
};

}  // namespace

StatusOr<std::map<std::string, std::string>> ParseAttributes(std::string_view body, const std::string& where) {
  // A server that says it is the metadata server (Metadata-Flavor: Google)
  // and answers something that is not a JSON object will answer the same
  // again: retrying forever would hang the daemon after one log line, and
  // reading it as "no attributes" would run the trainer without its
  // configuration (no bucket: no checkpoint sync). So it is a permanent
  // failure: the run ends with a configuration error that says why.
  if (Trim(body).empty()) return std::map<std::string, std::string>{};
  // nlohmann's parser is iterative but dump() recurses once per level.
  if (JsonNestingDepth(body, kMaxAttributeDepth) > kMaxAttributeDepth) {
    return FailedPreconditionError(fmt::format("{}: the answer nests JSON deeper than {} levels; not attributes", where,
                                               kMaxAttributeDepth));
  }
  auto json = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object()) {
    auto shown = body.substr(0, output::Utf8SafePrefixLength(body, 80));
    return FailedPreconditionError(fmt::format("{}: expected a JSON object of attributes, got {}\"{}\"{}", where,
                                               json.is_discarded() ? "malformed JSON " : "",
                                               output::EscapeInvalidUtf8(shown), shown.size() < body.size() ? "..." : ""));
  }
  std::map<std::string, std::string> out;
  for (auto const& [k, v] : json.items()) {
    // Attribute values are strings; anything else is kept as its JSON text.
    // `replace`: never throw on text, whatever it holds.
    out[k] = v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  return out;
}

int JsonNestingDepth(std::string_view text, int limit) {
  int depth = 0, max = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max = std::max(max, ++depth);
      if (max > limit) return max;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max;
}

MetadataEndpoint MetadataEndpointFromEnv() {
  MetadataEndpoint e;
  if (const char* host = std::getenv("GCE_METADATA_HOST"); host != nullptr && *host != '\0') {
    e.host = host;
  }
  return e;
}

std::chrono::milliseconds LongPollHttpTimeout(std::chrono::seconds timeout) {
  auto margin = std::clamp<std::chrono::seconds>(timeout, std::chrono::seconds(1), std::chrono::seconds(10));
  return timeout + margin;
}

std::unique_ptr<MetadataClient> MakeMetadataClient(MetadataEndpoint endpoint, std::unique_ptr<HttpClient> http,
                                                   std::function<std::unique_ptr<HttpClient>()> make_http) {
  return std::make_unique<MetadataClientImpl>(std::move(endpoint), std::move(http), std::move(make_http));
}

}  // namespace spotvisor
