#include "metadata/metadata_client.h"

#include <cstdlib>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace spotvisor {
namespace {

class MetadataClientImpl final : public MetadataClient {
 public:
  MetadataClientImpl(MetadataEndpoint endpoint, std::unique_ptr<HttpClient> http)
      : endpoint_(std::move(endpoint)), http_(std::move(http)) {}

  StatusOr<MetadataValue> Get(const std::string& path) override {
    return Fetch(path, "", std::chrono::milliseconds(10'000));
  }

  StatusOr<MetadataValue> Watch(const std::string& path, const std::string& last_etag,
                                std::chrono::seconds timeout) override {
    std::string query = fmt::format("wait_for_change=true&timeout_sec={}", timeout.count());
    if (!last_etag.empty()) query += "&last_etag=" + last_etag;
    return Fetch(path, query, LongPollHttpTimeout(timeout));
  }

  StatusOr<std::map<std::string, std::string>> GetAttributes(const std::string& dir) override {
    auto r = Fetch(dir, "recursive=true", std::chrono::milliseconds(10'000));
    if (!r.ok()) return r.status();
    auto json = nlohmann::json::parse(r->value, nullptr, /*allow_exceptions=*/false);
    if (!json.is_object()) {
      return UnavailableError(fmt::format("metadata {}: expected a JSON object, got {:.80}", dir, r->value));
    }
    std::map<std::string, std::string> out;
    for (auto const& [k, v] : json.items()) {
      out[k] = v.is_string() ? v.get<std::string>() : v.dump();
    }
    return out;
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
  StatusOr<MetadataValue> Fetch(const std::string& path, const std::string& query,
                                std::chrono::milliseconds timeout) {
    HttpRequest req;
    req.url = fmt::format("http://{}/computeMetadata/v1/{}", endpoint_.host, path);
    if (!query.empty()) req.url += "?" + query;
    req.headers = {{"Metadata-Flavor", "Google"}};
    req.timeout = timeout;
    req.connect_timeout = endpoint_.connect_timeout;
    auto r = http_->Perform(req);
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
      default:
        return UnavailableError(fmt::format("{}: HTTP {}", where, r->status));
    }
  }

  MetadataEndpoint endpoint_;
  std::unique_ptr<HttpClient> http_;
};

}  // namespace

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

std::unique_ptr<MetadataClient> MakeMetadataClient(MetadataEndpoint endpoint,
                                                   std::unique_ptr<HttpClient> http) {
  return std::make_unique<MetadataClientImpl>(std::move(endpoint), std::move(http));
}

}  // namespace spotvisor
