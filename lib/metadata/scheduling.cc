#include "metadata/scheduling.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/duration.h"
#include "common/strings.h"
#include "log/logger.h"

namespace spotvisor {
namespace {

const std::string* Find(const std::map<std::string, std::string>& m, const char* camel, const char* kebab) {
  if (auto it = m.find(camel); it != m.end()) return &it->second;
  if (auto it = m.find(kebab); it != m.end()) return &it->second;
  return nullptr;
}

// Whole seconds, at most ~30,000 years' worth: a duration, not a wrap.
std::optional<std::chrono::milliseconds> Seconds(std::string_view s) {
  auto n = ParseUint64(s);
  if (!n || *n == 0 || *n > 1'000'000'000'000ull) return std::nullopt;
  return std::chrono::seconds(static_cast<std::int64_t>(*n));
}

std::optional<std::chrono::milliseconds> ParseGceDuration(const std::string& raw) {
  auto text = Trim(raw);
  if (ParseUint64(text)) return Seconds(text);
  if (auto d = ParseDuration(text); d.ok() && d->count() > 0) return *d;
  // compute v1 Duration: {"seconds": "120", "nanos": 0}
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_object()) {
    auto it = j.find("seconds");
    if (it != j.end() && it->is_number_integer() && it->get<long long>() > 0 && it->get<long long>() < 1'000'000'000'000) {
      return std::chrono::seconds(it->get<long long>());
    }
    if (it != j.end() && it->is_string()) return Seconds(it->get<std::string>());
  }
  return std::nullopt;
}

}  // namespace

GceLimits ReadGceLimits(const std::map<std::string, std::string>& s) {
  GceLimits l;
  if (auto v = Find(s, "preemptionNoticeDuration", "preemption-notice-duration")) l.preemption_notice = ParseGceDuration(*v);
  if (auto v = Find(s, "maxRunDuration", "max-run-duration")) l.max_run_duration = ParseGceDuration(*v);
  if (auto v = Find(s, "terminationTime", "termination-time")) {
    l.termination_time = ParseRfc3339(Trim(*v));
    if (l.termination_time) l.termination_time_text = std::string(Trim(*v));
  }
  return l;
}

std::optional<WallTime> GceEnd(const GceLimits& l, WallTime vm_started) {
  std::optional<WallTime> end = l.termination_time;
  if (l.max_run_duration) {
    auto by_duration = vm_started + std::chrono::duration_cast<WallTime::duration>(*l.max_run_duration);
    if (!end || by_duration < *end) end = by_duration;
  }
  return end;
}

std::string GceLimitWarning(WallTime gce_end, WallTime started, std::chrono::milliseconds max_runtime,
                            std::chrono::milliseconds stop_budget, const std::string& source) {
  auto latest_stop = gce_end - std::chrono::duration_cast<WallTime::duration>(stop_budget);
  if (max_runtime.count() > 0 && started + std::chrono::duration_cast<WallTime::duration>(max_runtime) <= latest_stop) {
    return "";
  }
  auto room = std::chrono::duration_cast<std::chrono::minutes>(latest_stop - started);
  std::string what = max_runtime.count() > 0 ? fmt::format("max-runtime {} ends later", FormatDuration(max_runtime))
                                              : std::string("max-runtime is not set");
  if (room.count() <= 0) {
    return fmt::format("GCE ends this VM at {} ({}), too soon for a graceful stop and a final sync ({}); {}: the trainer "
                       "may be cut off without a save",
                       FormatRfc3339(gce_end), source, FormatDuration(stop_budget), what);
  }
  return fmt::format("GCE ends this VM at {} ({}) without a graceful stop; {}: set spotvisor-max-runtime to at most {} so "
                     "the trainer is stopped and its checkpoint synced first (that leaves {} for the stop and the final "
                     "sync)",
                     FormatRfc3339(gce_end), source, what, FormatDuration(room), FormatDuration(stop_budget));
}

}  // namespace spotvisor
