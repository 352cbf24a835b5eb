#include "run/budget.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/strings.h"
#include "log/logger.h"
#include "output/utf8.h"

namespace spotvisor {

BootVerdict JudgeBootEnd(const std::string& reason) {
  for (const char* r : {"failed", "restore-failed", "mount-failed", "sync-failed", "sync-stalled"}) {
    if (reason == r) return BootVerdict::kFailure;
  }
  for (const char* r : {"", "preempted", "maintenance", "stopped", "gang-ended", "gang-form-failed", "run-failed"}) {
    if (reason == r) return BootVerdict::kNeutral;
  }
  return BootVerdict::kReset;
}

BootVerdict JudgeBoot(const Boot& b) { return b.ended_at ? JudgeBootEnd(b.reason) : BootVerdict::kNeutral; }

std::vector<std::string> FailedInARow(const std::vector<Boot>& boots) {
  std::vector<std::string> out;
  for (auto it = boots.rbegin(); it != boots.rend(); ++it) {
    auto v = JudgeBoot(*it);
    if (v == BootVerdict::kReset) break;
    if (v == BootVerdict::kFailure) out.insert(out.begin(), it->name);
    if (it->budget_reset) break;  // FAILED was deleted before this boot: a new count began with it
  }
  return out;
}

RunBudget::RunBudget(std::shared_ptr<ObjectStore> run_store, std::string run_id, int max, const Clock& clock)
    : store_(std::move(run_store)), run_id_(std::move(run_id)), max_(max), clock_(clock) {}

StatusOr<std::optional<nlohmann::json>> RunBudget::ReadStopRequest(const CallContext& ctx) {
  auto text = store_->ReadBytes(kStopObject, nullptr, ctx);
  if (!text.ok()) {
    if (text.status().code() == StatusCode::kNotFound) return std::optional<nlohmann::json>();
    return Status(text.status().code(), "reading " + run_id_ + "/" + kStopObject + ": " + text.status().message());
  }
  // Anything there is a stop; only a plain `by` is kept, for the log.
  auto j = nlohmann::json::parse(*text, nullptr, false);
  std::string by = j.is_object() && j.contains("by") && j["by"].is_string() ? j["by"].get<std::string>() : "";
  return std::optional<nlohmann::json>(nlohmann::json{{"by", output::EscapeInvalidUtf8(by.substr(0, 200))}});
}

StatusOr<BudgetState> RunBudget::Check(const CallContext& ctx, std::vector<std::string>* problems) {
  BudgetState out;
  auto stop = ReadStopRequest(ctx);
  if (!stop.ok()) return stop.status();
  out.stop_request = *stop;
  auto marker = store_->ReadBytes(kFailedObject, nullptr, ctx);
  if (marker.ok()) {
    auto j = nlohmann::json::parse(*marker, nullptr, false);
    out.failed_marker = j.is_discarded() ? nlohmann::json(output::EscapeInvalidUtf8(marker->substr(0, 200))) : j;
    return out;
  }
  if (marker.status().code() != StatusCode::kNotFound) {
    return Status(marker.status().code(), "reading " + MarkerName() + ": " + marker.status().message());
  }
  auto listed = store_->List(kBootsDir, ctx);
  if (!listed.ok()) return Status(listed.status().code(), "listing " + run_id_ + "/" + kBootsDir + ": " + listed.status().message());
  std::vector<Boot> boots;
  for (auto const& obj : *listed) {
    auto text = store_->ReadBytes(obj.name, nullptr, ctx);
    if (!text.ok()) {
      if (text.status().code() == StatusCode::kNotFound) continue;
      return Status(text.status().code(), "reading " + run_id_ + "/" + obj.name + ": " + text.status().message());
    }
    auto b = ParseBoot(obj.name, *text);  // named as BootRecord::name() names it
    if (!b.ok()) {
      if (problems) problems->push_back(b.status().message());
      continue;
    }
    boots.push_back(*std::move(b));
  }
  std::sort(boots.begin(), boots.end(), [](auto const& a, auto const& b) { return a.started_at < b.started_at; });
  out.failed_in_a_row = FailedInARow(boots);
  if (max_ > 0 && static_cast<int>(out.failed_in_a_row.size()) >= max_) {
    // Used up, yet no FAILED: a person deleted it to let the run go on.
    out.budget_reset = true;
    out.failed_in_a_row.clear();
  }
  return out;
}

Status RunBudget::MarkFailed(const std::vector<std::string>& failed_boots, const std::string& instance,
                             const std::string& reason, const CallContext& ctx, bool* already) {
  nlohmann::json j = {{"version", 1},
                      {"run_id", run_id_},
                      {"failed_boots", failed_boots},
                      {"max_failed_boots", max_},
                      {"instance", instance},
                      {"marked_at", FormatRfc3339(clock_.WallNow())},
                      {"reason", reason}};
  Precondition absent;
  absent.if_generation_match = 0;
  auto r = store_->UploadBytes(kFailedObject, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n",
                               absent, ctx);
  if (r.ok()) return OkStatus();
  if (r.status().code() == StatusCode::kFailedPrecondition) {
    if (already) *already = true;
    return OkStatus();
  }
  return Status(r.status().code(), "writing " + MarkerName() + ": " + r.status().message());
}

}  // namespace spotvisor
