#include "storage/token_provider.h"

#include <nlohmann/json.hpp>

namespace spotvisor {
namespace {

class NoAuth final : public TokenProvider {
 public:
  StatusOr<std::string> AuthorizationHeader() override { return std::string(); }
};

}  // namespace

std::unique_ptr<TokenProvider> MakeNoAuthTokenProvider() { return std::make_unique<NoAuth>(); }

StatusOr<std::string> MetadataTokenProvider::AuthorizationHeader() {
  std::lock_guard lk(mu_);
  auto now = clock_.Now();
  if (!header_.empty() && now < refresh_at_) return header_;
  auto r = client_->Get("instance/service-accounts/default/token");
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
  auto expires = std::chrono::seconds(j.value("expires_in", 300));
  // Refresh five minutes early (or half-way, for short-lived tokens).
  refresh_at_ = now + std::max(expires - std::chrono::seconds(300), expires / 2);
  header_ = "Bearer " + j["access_token"].get<std::string>();
  return header_;
}

}  // namespace spotvisor
