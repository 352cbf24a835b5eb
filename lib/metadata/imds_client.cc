#include "metadata/imds_client.h"

#include <cstdlib>

#include <fmt/format.h>

#include "output/utf8.h"
#include "storage/transfer.h"

namespace spotvisor {
namespace {

class Imds final : public ImdsClient {
 public:
  Imds(ImdsOptions o, const Clock& clock) : o_(std::move(o)), clock_(clock), http_(o_.make_http) {
    if (o_.endpoint.empty()) o_.endpoint = ImdsEndpointFromEnv();
    while (!o_.endpoint.empty() && o_.endpoint.back() == '/') o_.endpoint.pop_back();
  }

  std::string Endpoint() const override { return o_.endpoint; }

  StatusOr<std::string> Get(const std::string& path, const CallContext& ctx) override {
    for (int attempt = 0;; ++attempt) {
      auto token = Token(ctx);
      if (!token.ok()) return token.status();
      HttpRequest req = Request("GET", o_.endpoint + "/latest/" + path);
      req.headers = {{"X-aws-ec2-metadata-token", *token}};
      auto r = http_.Send(req, ctx);
      if (!r.ok()) return Status(r.status().code(), fmt::format("EC2 metadata {}: {}", path, r.status().message()));
      if (r->status == 200) return std::move(r->body);
      if (r->status == 404) return NotFoundError(fmt::format("EC2 metadata {}: not found", path));
      if (r->status == 401 && attempt == 0) {
        // The token expired early (or the service restarted): a new one, once.
        std::lock_guard lk(mu_);
        token_.clear();
        continue;
      }
      return UnavailableError(fmt::format("EC2 metadata {}: HTTP {}: {}", path, r->status,
                                          output::EscapeInvalidUtf8(r->body.substr(0, 200))));
    }
  }

 private:
  HttpRequest Request(const std::string& method, const std::string& url) const {
    HttpRequest r;
    r.method = method;
    r.url = url;
    r.timeout = o_.timeout;
    r.connect_timeout = o_.connect_timeout;
    return r;
  }

  // The session token, fetched when missing or within a minute of expiry.
  StatusOr<std::string> Token(const CallContext& ctx) {
    std::lock_guard lk(mu_);
    if (!token_.empty() && clock_.Now() < refresh_at_) return token_;
    HttpRequest req = Request("PUT", o_.endpoint + "/latest/api/token");
    req.headers = {{"X-aws-ec2-metadata-token-ttl-seconds", std::to_string(o_.token_ttl.count())}};
    auto started = clock_.Now();
    auto r = http_.Send(req, ctx);
    if (!r.ok()) {
      return Status(r.status().code(), fmt::format("EC2 metadata service at {}: {}", o_.endpoint, r.status().message()));
    }
    if (r->status == 403) {
      return PermissionDeniedError(fmt::format(
          "EC2 metadata service at {} refused a session token (HTTP 403): IMDS may be disabled for this instance "
          "(aws ec2 modify-instance-metadata-options --http-endpoint enabled)",
          o_.endpoint));
    }
    if (r->status != 200 || r->body.empty() || r->body.size() > 4096 ||
        r->body.find_first_of("\r\n\0", 0, 3) != std::string::npos) {
      return UnavailableError(fmt::format("EC2 metadata service at {}: no session token (HTTP {})", o_.endpoint, r->status));
    }
    token_ = std::move(r->body);
    auto ttl = o_.token_ttl;
    refresh_at_ = started + (ttl > std::chrono::seconds(120) ? ttl - std::chrono::seconds(60) : ttl / 2);
    return token_;
  }

  ImdsOptions o_;
  const Clock& clock_;
  HttpPool http_;
  std::mutex mu_;
  std::string token_;
  SteadyTime refresh_at_{};
};

}  // namespace

std::string ImdsEndpointFromEnv() {
  const char* e = std::getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  std::string v = e && *e ? e : "http://169.254.169.254";
  if (v.find("://") == std::string::npos) v = "http://" + v;
  return v;
}

std::unique_ptr<ImdsClient> MakeImdsClient(ImdsOptions options, const Clock& clock) {
  return std::make_unique<Imds>(std::move(options), clock);
}

}  // namespace spotvisor
