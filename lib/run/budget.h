// A run's budget of failed boots (issue #30), from its boot records
// (run/boots.h): a run whose trainer fails at every boot (bad code, a missing
// dataset) must not be brought back by its group forever. After
// max-failed-boots failed boots in a row the run is marked failed beside
// DONE, and every later boot ends at once.
//
//   RUN_ID/FAILED   {"version": 1, "run_id", "failed_boots": [boot names],
//                    "max_failed_boots", "instance", "marked_at", "reason"}
//   written only if there is none yet; deleting it (or a new run-id) lets
//   the run start again.
//
// What counts: a boot that ended failed, restore-failed, mount-failed,
// sync-failed or sync-stalled is a failure. A boot that was preempted, met a
// maintenance, lost its gang, was stopped by a signal, or whose VM vanished
// (no end recorded) is neither: it does not count and does not reset the
// count. Any other ending (completed, max-runtime, idle) resets it. Deleting
// FAILED gives the run a whole new budget: the next boot finds the count used
// up without the marker, and its record says budget_reset, where later
// counts stop.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "run/boots.h"
#include "storage/object_store.h"

namespace spotvisor {

inline constexpr char kFailedObject[] = "FAILED";
// `spotvisor stop` (app/runs_command.h): {"version": 1, "requested_at", "by"};
// the VMs of the run stop gracefully (final sync, on-exit) and no later boot
// trains. Written only if absent; deleting it lets the run go on.
inline constexpr char kStopObject[] = "STOP";

enum class BootVerdict { kFailure, kNeutral, kReset };
BootVerdict JudgeBootEnd(const std::string& reason);  // a run.end reason ("" = not ended)
BootVerdict JudgeBoot(const Boot& b);

// Failed boots in a row, newest last, ending at the newest boot.
std::vector<std::string> FailedInARow(const std::vector<Boot>& boots_oldest_first);

struct BudgetState {
  std::optional<nlohmann::json> failed_marker;  // RUN_ID/FAILED, when there is one
  std::optional<nlohmann::json> stop_request;   // RUN_ID/STOP, when there is one
  std::vector<std::string> failed_in_a_row;      // the boots before this one
  // The boots before used the budget up but FAILED is gone (deleted to let
  // the run go on): this boot starts a new count (Boot::budget_reset).
  bool budget_reset = false;
};

class RunBudget {
 public:
  // `run_store`: rooted at RUN_ID/ (the claims' store). `max` 0: no limit.
  RunBudget(std::shared_ptr<ObjectStore> run_store, std::string run_id, int max, const Clock& clock);
  int max() const { return max_; }
  // The marker and the failed boots before this one; a boot record that
  // cannot be read is skipped (named in `problems`).
  StatusOr<BudgetState> Check(const CallContext& ctx, std::vector<std::string>* problems = nullptr);
  // Writes RUN_ID/FAILED unless it exists (then: OK, `already` set).
  Status MarkFailed(const std::vector<std::string>& failed_boots, const std::string& instance, const std::string& reason,
                    const CallContext& ctx, bool* already = nullptr);
  std::string MarkerName() const { return run_id_ + "/" + kFailedObject; }
  // RUN_ID/STOP, when `spotvisor stop` wrote it.
  StatusOr<std::optional<nlohmann::json>> ReadStopRequest(const CallContext& ctx);

 private:
  std::shared_ptr<ObjectStore> store_;
  std::string run_id_;
  int max_;
  const Clock& clock_;
};

}  // namespace spotvisor
