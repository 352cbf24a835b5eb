// Each boot of a run (issue #28): the second part of the run's record in the
// bucket, beside the claims (run/claim.h). Every spotvisor process working on
// a run writes one record when it begins (once its restore has looked at the
// bucket; its claim comes before) and completes
// it when the run ends there: where it ran, when, how it ended, and how much
// work was not committed then. A boot whose VM vanished (a preemption that
// took spotvisor too, a crash, a power cut) keeps `ended_at` null. Unattended
// runs (issue #30) count their failed boots and preemptions from these.
//
//   RUN_ID/boots/STARTED-INSTANCE.TOKEN.json
//     {"version": 1, "run_id", "instance", "zone", "group", "token", "started_at",
//      "ended_at", "reason", "exit_code", "vm_seconds", "uncommitted_files",
//      "uncommitted_bytes", "sequence"}
//
// STARTED (YYYYmmddTHHMMSSZ) sorts the records by when the boot began; TOKEN
// is the claim's, drawn afresh by each process: one writer per record.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "storage/object_store.h"

namespace spotvisor {

inline constexpr char kBootsDir[] = "boots/";

struct Boot {
  std::string name;  // the object, relative to RUN_ID/
  std::string run_id, instance, zone, token;
  std::string group;  // the VM's group (compute/group.h Path()), "" for none
  WallTime started_at;
  std::optional<WallTime> ended_at;  // nullopt: not ended (running, or the VM vanished)
  std::string reason;                // the run's end reason (run.end), "" while not ended
  std::optional<int> exit_code;
  std::optional<double> vm_seconds;
  std::optional<int> uncommitted_files;            // work not committed when it ended
  std::optional<std::uint64_t> uncommitted_bytes;
  std::int64_t sequence = 0;  // the newest commit it knew of when it ended
  // This boot found the budget used up but no FAILED marker: a person
  // deleted it, and the count of failed boots starts again here (budget.h).
  bool budget_reset = false;
};

std::string BootJson(const Boot& b);
StatusOr<Boot> ParseBoot(const std::string& name, std::string_view text);

struct BootEnd {
  std::string reason;
  int exit_code = 0;
  std::optional<int> uncommitted_files;
  std::optional<std::uint64_t> uncommitted_bytes;
  std::int64_t sequence = 0;
};

// This process's boot record. Thread-safe.
class BootRecord {
 public:
  BootRecord(std::shared_ptr<ObjectStore> run_store, std::string run_id, std::string instance, std::string zone,
             std::string token, const Clock& clock);
  Status Begin(const CallContext& ctx);
  Status End(const BootEnd& end, const CallContext& ctx);
  const std::string& name() const { return boot_.name; }
  void SetBudgetReset() {
    std::lock_guard lk(mu_);
    boot_.budget_reset = true;
  }
  void SetGroup(std::string group) {
    std::lock_guard lk(mu_);
    boot_.group = std::move(group);
  }

 private:
  std::shared_ptr<ObjectStore> store_;
  const Clock& clock_;
  std::mutex mu_;
  Boot boot_;
};

// A run's boot records, oldest first; unreadable ones go to `problems`.
struct RunBoots {
  std::vector<Boot> boots;
  std::vector<std::string> problems;
};
RunBoots ReadBoots(ObjectStore& store, const std::string& run_id, const std::vector<ObjectInfo>& run_objects,
                   const CallContext& ctx);

}  // namespace spotvisor
