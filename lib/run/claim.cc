#include "run/claim.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/random.h"
#include "log/logger.h"
#include "output/utf8.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;

std::string Token() { return fmt::format("{:016x}", RandomSeed()); }

}  // namespace

std::string ClaimJson(const Claim& c) {
  Json j = {{"version", 1},
            {"run_id", c.run_id},
            {"instance", c.instance},
            {"token", c.token},
            {"state", c.state},
            {"claimed_at", FormatRfc3339(c.claimed_at)},
            {"renewed_at", FormatRfc3339(c.renewed_at)},
            {"expires_at", FormatRfc3339(c.expires_at)},
            {"ttl_s", c.ttl.count()}};
  return j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
}

StatusOr<Claim> ParseClaim(const std::string& name, std::string_view text) {
  auto j = Json::parse(text, nullptr, false);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(fmt::format("claim {}: {}", output::EscapeInvalidUtf8(name), why));
  };
  if (!j.is_object()) return bad("not a JSON object");
  Claim c;
  c.name = name;
  auto str = [&](const char* k, std::string& out) -> bool {
    auto it = j.find(k);
    if (it == j.end() || !it->is_string()) return false;
    out = it->get<std::string>();
    return true;
  };
  auto time = [&](const char* k, WallTime& out) -> bool {
    std::string s;
    if (!str(k, s)) return false;
    auto t = ParseRfc3339(s);
    if (!t) return false;
    out = *t;
    return true;
  };
  if (!str("run_id", c.run_id) || !str("instance", c.instance) || !str("token", c.token) || !str("state", c.state)) {
    return bad("run_id, instance, token and state must be strings");
  }
  if (!time("claimed_at", c.claimed_at) || !time("renewed_at", c.renewed_at) || !time("expires_at", c.expires_at)) {
    return bad("claimed_at, renewed_at and expires_at must be RFC 3339 times");
  }
  auto ttl = j.find("ttl_s");
  if (ttl == j.end() || !ttl->is_number_integer() || ttl->get<long long>() <= 0 || ttl->get<long long>() > 86400 * 7) {
    return bad("ttl_s must be a number of seconds (1 to a week)");
  }
  c.ttl = std::chrono::seconds(ttl->get<long long>());
  return c;
}

RunClaim::RunClaim(std::shared_ptr<ObjectStore> run_store, std::string run_id, std::string instance,
                   std::chrono::seconds ttl, const Clock& clock)
    : store_(std::move(run_store)), clock_(clock) {
  claim_.run_id = std::move(run_id);
  claim_.instance = std::move(instance);
  claim_.token = Token();
  claim_.ttl = ttl;
  // The instance name is the VM's (letters, digits, '-'); anything else is
  // replaced, so the name stays one path segment.
  std::string safe;
  for (char ch : claim_.instance) safe += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_') ? ch : '_';
  claim_.name = fmt::format("{}{}.{}.json", kClaimsDir, safe.empty() ? "vm" : safe.substr(0, 100), claim_.token);
}

Status RunClaim::Renew(const std::string& state, const CallContext& ctx) {
  std::lock_guard lk(mu_);
  auto now = clock_.WallNow();
  if (!written_) claim_.claimed_at = now;
  claim_.state = state;
  claim_.renewed_at = now;
  claim_.expires_at = now + claim_.ttl;
  auto r = store_->UploadBytes(claim_.name, ClaimJson(claim_), {}, ctx);
  if (!r.ok()) return Status(r.status().code(), "writing the run's claim " + claim_.name + ": " + r.status().message());
  written_ = true;
  return OkStatus();
}

Status RunClaim::Release(const CallContext& ctx) {
  std::lock_guard lk(mu_);
  auto s = store_->Delete(claim_.name, {}, ctx);
  if (!s.ok() && s.code() != StatusCode::kNotFound) {
    return Status(s.code(), "deleting the run's claim " + claim_.name + ": " + s.message());
  }
  written_ = false;
  return OkStatus();
}

bool RunClaims::AnyLive(WallTime now) const {
  if (!problems.empty()) return true;
  for (auto const& c : claims) {
    if (c.LiveAt(now)) return true;
  }
  return false;
}

RunClaims ReadClaims(ObjectStore& store, const std::string& run_id, const std::vector<ObjectInfo>& run_objects,
                     const CallContext& ctx) {
  RunClaims out;
  auto prefix = run_id + "/" + kClaimsDir;
  for (auto const& obj : run_objects) {
    if (obj.name.compare(0, prefix.size(), prefix) != 0) continue;
    auto text = store.ReadBytes(obj.name, nullptr, ctx);
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) continue;  // released meanwhile
      out.problems.push_back(fmt::format("{}: {}", output::EscapeInvalidUtf8(obj.name), text.status().message()));
      continue;
    }
    auto c = ParseClaim(obj.name, *text);
    if (!c.ok()) {
      out.problems.push_back(c.status().message());
      continue;
    }
    out.claims.push_back(std::move(*c));
  }
  return out;
}

}  // namespace spotvisor
