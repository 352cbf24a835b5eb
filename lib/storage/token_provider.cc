#include "storage/token_provider.h"

#include <algorithm>
#include <cstdint>

#include <nlohmann/json.hpp>

namespace spotvisor {
namespace {

class NoAuth final : public TokenProvider {
 public:
  using TokenProvider::AuthorizationHeader;
  StatusOr<std::string> AuthorizationHeader(const CallContext&) override { return std::string(); }
};

}  // namespace

std::unique_ptr<TokenProvider> MakeNoAuthTokenProvider() { return std::make_unique<NoAuth>(); }

StatusOr<std::string> MetadataTokenProvider::AuthorizationHeader(const CallContext& ctx) {
  // A caller waiting here for another's fetch waits at most that fetch's
  // own bound (10 s, or its context's).
  std::lock_guard lk(mu_);
  auto now = clock_.Now();
  if (!header_.empty() && now < refresh_at_) return header_;
  auto r = client_->Get("instance/service-accounts/default/token", ctx);
  if (!r.ok()) {
    if (r.status().code() == StatusCode::kNotFound) {
      return PermissionDeniedError("this VM has no service account (metadata has no default token); "
                                   "create it with --service-account and --scopes=storage-rw or storage-full");
    }
    return r.status();
  }
  auto j = nlohmann::json::parse(r->value, nullptr, false);
  if (!j.is_object() || !j.contains("access_token") || !j["access_token"].is_string()) {
    return UnavailableError("metadata token response is not the expected JSON");
  }
  // expires_in: seconds, a number; anything else (a string, out of range) means the usual 300.
  std::int64_t expires_in = 300;
  if (auto e = j.find("expires_in"); e != j.end() && e->is_number_integer()) {
    expires_in = std::clamp<std::int64_t>(e->get<std::int64_t>(), 0, 24 * 3600);
  } else if (e != j.end() && e->is_number_unsigned()) {
    expires_in = std::min<std::uint64_t>(e->get<std::uint64_t>(), 24 * 3600);
  }
  auto expires = std::chrono::seconds(expires_in);
  // Refresh five minutes early (or half-way, for short-lived tokens).
  refresh_at_ = now + std::max(expires - std::chrono::seconds(300), expires / 2);
  header_ = "Bearer " + j["access_token"].get<std::string>();
  return header_;
}

}  // namespace spotvisor
