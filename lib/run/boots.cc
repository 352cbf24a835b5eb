#include "run/boots.h"

#include <algorithm>
#include <cctype>
#include <ctime>
#include <limits>
#include <type_traits>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "log/logger.h"
#include "output/utf8.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;

}  // namespace

std::string BootJson(const Boot& b) {
  auto opt = [](auto const& v) { return v ? Json(*v) : Json(nullptr); };
  Json j = {{"version", 1},
            {"run_id", b.run_id},
            {"instance", b.instance},
            {"zone", b.zone},
            {"group", b.group.empty() ? Json(nullptr) : Json(b.group)},
            {"budget_reset", b.budget_reset},
            {"token", b.token},
            {"started_at", FormatRfc3339(b.started_at)},
            {"ended_at", b.ended_at ? Json(FormatRfc3339(*b.ended_at)) : Json(nullptr)},
            {"reason", b.reason.empty() ? Json(nullptr) : Json(b.reason)},
            {"exit_code", opt(b.exit_code)},
            {"vm_seconds", opt(b.vm_seconds)},
            {"uncommitted_files", opt(b.uncommitted_files)},
            {"uncommitted_bytes", opt(b.uncommitted_bytes)},
            {"sequence", b.sequence}};
  return j.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
}

StatusOr<Boot> ParseBoot(const std::string& name, std::string_view text) {
  auto j = Json::parse(text, nullptr, false);
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError(fmt::format("boot record {}: {}", output::EscapeInvalidUtf8(name), why));
  };
  if (!j.is_object()) return bad("not a JSON object");
  Boot b;
  b.name = name;
  auto str = [&](const char* k, std::string& out, bool required) -> bool {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return !required;
    if (!it->is_string()) return false;
    out = it->get<std::string>();
    return true;
  };
  if (!str("run_id", b.run_id, true) || !str("instance", b.instance, true) || !str("zone", b.zone, false) ||
      !str("token", b.token, true) || !str("reason", b.reason, false) || !str("group", b.group, false)) {
    return bad("run_id, instance and token must be strings (zone, group and reason strings or null)");
  }
  std::string started, ended;
  if (!str("started_at", started, true) || !str("ended_at", ended, false)) return bad("started_at must be a time");
  auto s = ParseRfc3339(started);
  if (!s) return bad("started_at is not an RFC 3339 time");
  b.started_at = *s;
  if (!ended.empty()) {
    auto e = ParseRfc3339(ended);
    if (!e) return bad("ended_at is not an RFC 3339 time");
    b.ended_at = *e;
  }
  auto num = [&](const char* k, auto& out, long long lo, long long hi) -> bool {
    auto it = j.find(k);
    if (it == j.end() || it->is_null()) return true;
    if (!it->is_number_integer() || it->template get<long long>() < lo || it->template get<long long>() > hi) return false;
    out = static_cast<std::remove_reference_t<decltype(*out)>>(it->template get<long long>());
    return true;
  };
  std::optional<int> code, files;
  std::optional<std::uint64_t> bytes;
  if (!num("exit_code", code, -1, 1 << 16) || !num("uncommitted_files", files, 0, 1 << 30) ||
      !num("uncommitted_bytes", bytes, 0, std::numeric_limits<long long>::max())) {
    return bad("exit_code, uncommitted_files and uncommitted_bytes must be whole numbers in range, or null");
  }
  b.exit_code = code;
  b.uncommitted_files = files;
  b.uncommitted_bytes = bytes;
  if (auto it = j.find("vm_seconds"); it != j.end() && !it->is_null()) {
    if (!it->is_number() || it->get<double>() < 0) return bad("vm_seconds must be a non-negative number");
    b.vm_seconds = it->get<double>();
  }
  if (auto it = j.find("budget_reset"); it != j.end() && it->is_boolean()) b.budget_reset = it->get<bool>();
  if (auto it = j.find("sequence"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<long long>() < 0) return bad("sequence must be a whole number");
    b.sequence = it->get<long long>();
  }
  return b;
}

BootRecord::BootRecord(std::shared_ptr<ObjectStore> run_store, std::string run_id, std::string instance,
                       std::string zone, std::string token, const Clock& clock)
    : store_(std::move(run_store)), clock_(clock) {
  boot_.run_id = std::move(run_id);
  boot_.instance = std::move(instance);
  boot_.zone = std::move(zone);
  boot_.token = std::move(token);
  boot_.started_at = clock_.WallNow();
  std::string safe;
  for (char ch : boot_.instance) safe += (std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_') ? ch : '_';
  boot_.name = fmt::format("{}{}-{}.{}.json", kBootsDir, FormatCompactUtc(boot_.started_at), safe.empty() ? "vm" : safe.substr(0, 100),
                           boot_.token);
}

Status BootRecord::Begin(const CallContext& ctx) {
  std::lock_guard lk(mu_);
  auto r = store_->UploadBytes(boot_.name, BootJson(boot_), {}, ctx);
  return r.ok() ? OkStatus() : Status(r.status().code(), "writing the boot record " + boot_.name + ": " + r.status().message());
}

Status BootRecord::End(const BootEnd& end, const CallContext& ctx) {
  std::lock_guard lk(mu_);
  auto now = clock_.WallNow();
  boot_.ended_at = now;
  boot_.reason = end.reason;
  boot_.exit_code = end.exit_code;
  boot_.vm_seconds = std::max(0.0, std::chrono::duration<double>(now - boot_.started_at).count());
  boot_.uncommitted_files = end.uncommitted_files;
  boot_.uncommitted_bytes = end.uncommitted_bytes;
  boot_.sequence = end.sequence;
  auto r = store_->UploadBytes(boot_.name, BootJson(boot_), {}, ctx);
  return r.ok() ? OkStatus() : Status(r.status().code(), "completing the boot record " + boot_.name + ": " + r.status().message());
}

RunBoots ReadBoots(ObjectStore& store, const std::string& run_id, const std::vector<ObjectInfo>& run_objects,
                   const CallContext& ctx) {
  RunBoots out;
  auto prefix = run_id + "/" + kBootsDir;
  for (auto const& obj : run_objects) {
    if (obj.name.compare(0, prefix.size(), prefix) != 0) continue;
    auto text = store.ReadBytes(obj.name, nullptr, ctx);
    if (!text.ok()) {
      if (text.status().code() != StatusCode::kNotFound) {
        out.problems.push_back(fmt::format("{}: {}", output::EscapeInvalidUtf8(obj.name), text.status().message()));
      }
      continue;
    }
    auto b = ParseBoot(obj.name, *text);
    if (!b.ok()) {
      out.problems.push_back(b.status().message());
      continue;
    }
    out.boots.push_back(std::move(*b));
  }
  std::sort(out.boots.begin(), out.boots.end(), [](auto const& a, auto const& b) { return a.started_at < b.started_at; });
  return out;
}

}  // namespace spotvisor
