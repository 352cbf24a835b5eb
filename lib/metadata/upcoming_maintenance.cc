#include "metadata/upcoming_maintenance.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/strings.h"
#include "log/logger.h"
#include "output/utf8.h"

namespace spotvisor {
namespace {

using Json = nlohmann::json;

std::string Shown(std::string_view s) {
  auto cut = s.substr(0, output::Utf8SafePrefixLength(s, 120));
  return output::EscapeInvalidUtf8(std::string(cut)) + (cut.size() < s.size() ? "..." : "");
}

// The value of `camel` or `snake`, whichever is present.
const Json* Field(const Json& j, const char* camel, const char* snake) {
  if (auto it = j.find(camel); it != j.end() && !it->is_null()) return &*it;
  if (auto it = j.find(snake); it != j.end() && !it->is_null()) return &*it;
  return nullptr;
}

bool IsNone(std::string_view text) {
  auto t = Trim(text);
  return t.empty() || t == "NONE" || t == "none" || t == "null" || t == "{}";
}

}  // namespace

StatusOr<std::optional<UpcomingMaintenance>> ParseUpcomingMaintenance(std::string_view body) {
  if (body.size() > (1u << 16)) return InvalidArgumentError("upcoming-maintenance: answer larger than 64 KiB");
  if (IsNone(body)) return std::optional<UpcomingMaintenance>();
  auto j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  // A leaf asked for with ?alt=json comes back as a JSON string holding the value.
  if (j.is_string()) {
    auto inner = j.get<std::string>();
    if (IsNone(inner)) return std::optional<UpcomingMaintenance>();
    j = Json::parse(inner, nullptr, false);
  }
  if (j.is_null()) return std::optional<UpcomingMaintenance>();
  if (!j.is_object()) {
    return InvalidArgumentError(fmt::format("upcoming-maintenance: not NONE and not a JSON object: \"{}\"", Shown(body)));
  }
  if (j.empty()) return std::optional<UpcomingMaintenance>();
  UpcomingMaintenance m;
  auto text = [&](const char* camel, const char* snake, std::string& out) -> Status {
    const Json* v = Field(j, camel, snake);
    if (v == nullptr) return OkStatus();
    if (!v->is_string()) return InvalidArgumentError(fmt::format("upcoming-maintenance: {} is not a string", camel));
    out = v->get<std::string>();
    return OkStatus();
  };
  auto time = [&](const char* camel, const char* snake, std::string& out, std::optional<WallTime>& parsed) -> Status {
    if (auto s = text(camel, snake, out); !s.ok()) return s;
    if (out.empty()) return OkStatus();
    parsed = ParseRfc3339(out);
    if (!parsed) {
      return InvalidArgumentError(fmt::format("upcoming-maintenance: {} \"{}\" is not an RFC 3339 time", camel, Shown(out)));
    }
    return OkStatus();
  };
  for (auto s : {text("type", "type", m.type), text("maintenanceStatus", "maintenance_status", m.status),
                 time("windowStartTime", "window_start_time", m.window_start_text, m.window_start),
                 time("windowEndTime", "window_end_time", m.window_end_text, m.window_end),
                 time("latestWindowStartTime", "latest_window_start_time", m.latest_window_start_text,
                      m.latest_window_start)}) {
    if (!s.ok()) return s;
  }
  if (const Json* v = Field(j, "canReschedule", "can_reschedule")) {
    if (v->is_boolean()) {
      m.can_reschedule = v->get<bool>();
    } else if (v->is_string() && (v->get<std::string>() == "true" || v->get<std::string>() == "TRUE")) {
      m.can_reschedule = true;
    } else if (v->is_string() && (v->get<std::string>() == "false" || v->get<std::string>() == "FALSE")) {
      m.can_reschedule = false;
    } else {
      return InvalidArgumentError("upcoming-maintenance: canReschedule is not true or false");
    }
  }
  if (const Json* v = Field(j, "maintenanceReasons", "maintenance_reasons")) {
    if (v->is_string()) {
      m.reasons.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (auto const& r : *v) {
        if (!r.is_string()) return InvalidArgumentError("upcoming-maintenance: maintenanceReasons holds a non-string");
        m.reasons.push_back(r.get<std::string>());
      }
    } else {
      return InvalidArgumentError("upcoming-maintenance: maintenanceReasons is not a list of strings");
    }
  }
  if (m.status == "NONE" || (m.type.empty() && m.status.empty() && !m.window_start)) return std::optional<UpcomingMaintenance>();
  return std::optional<UpcomingMaintenance>(std::move(m));
}

bool IsNoMaintenanceAnswer(const Status& s) {
  if (s.code() == StatusCode::kNotFound) return true;
  return s.code() == StatusCode::kUnavailable && s.message().find("no notifications") != std::string::npos;
}

}  // namespace spotvisor
