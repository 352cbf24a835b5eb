// What the outside sees of a run, and who is told when it changes. The
// supervisor builds one RunView per change (after each event's actions) and
// hands it to every observer, as guest-agent's events package hands a
// watcher's news to its subscribers: status.json, guest attributes and
// systemd's notify socket are observers; the state machine's own events go
// to the logger. An observer never blocks the loop for long and never fails
// the run: problems are reported once, through the logger.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/asio.h"
#include "common/clock.h"
#include "log/logger.h"
#include "metadata/guest_attributes.h"
#include "notify/service_notifier.h"

namespace spotvisor {

struct RunView {
  std::string run_id, mode;
  std::string phase;  // PhaseName
  std::string state;  // StateName
  WallTime since{};   // when this state began
  std::optional<int> trainer_pid;  // running, not reaped yet
  std::string reason;              // EndReasonName, once known
  std::optional<int> exit_code;    // once done
  std::optional<SteadyTime> deadline;
  bool ending = false;             // what systemd hears as STOPPING=1
  std::string bucket;              // empty: none
  std::string group;               // the VM's group (compute/group.h Path()); empty: none
  std::string last_event, last_message;
  nlohmann::json last_sync;        // null: no sync yet
  nlohmann::json checkpoint;       // DurabilityTracker::Json; null: no bucket, or not restored yet
  nlohmann::json transfer;         // a sync or restore in progress (SyncProgress); null: none
  nlohmann::json gang;             // GangSession::StatusJson; null: no gang
  int spotvisor_pid = 0;
  std::optional<std::uint64_t> start_time_ticks;
  std::string boot_id;
};

class RunObserver {
 public:
  virtual ~RunObserver() = default;
  virtual void OnChange(const RunView& view) = 0;
  // The process is exiting: stop any timer of its own (the last changes,
  // such as `done`, are still reported).
  virtual void Close() {}
  // After a preemption notice: whatever it still sends at exit must be
  // done by `by` (the machine is taken soon after).
  virtual void FinishBy(SteadyTime /*by*/) {}
};

// STATE_DIR/status.json (what `spotvisor status` reads): replaced
// atomically on every change; a write failure is logged once per message.
class StatusFileObserver final : public RunObserver {
 public:
  StatusFileObserver(std::string state_dir, const Clock& clock, Logger& logger)
      : state_dir_(std::move(state_dir)), clock_(clock), logger_(logger) {}
  void OnChange(const RunView& view) override;
  // The JSON written (exposed for tests).
  nlohmann::json Json(const RunView& view) const;

 private:
  std::string state_dir_;
  const Clock& clock_;
  Logger& logger_;
  std::string error_;
};

// The same state as guest attributes (`gcloud compute instances
// get-guest-attributes`); the writer sends them from its own thread.
class GuestAttributesObserver final : public RunObserver {
 public:
  explicit GuestAttributesObserver(std::shared_ptr<GuestAttributesWriter> writer) : writer_(std::move(writer)) {}
  void OnChange(const RunView& view) override;
  void FinishBy(SteadyTime by) override { writer_->FinishBy(by); }

 private:
  std::shared_ptr<GuestAttributesWriter> writer_;
};

// On EC2: the phase (and how the run ended) as the instance tag
// spotvisor-phase, seen in the console or `aws ec2 describe-tags` without
// ssh. One tag, changed only when the phase or reason does (tags are not a
// log: CreateTags is throttled per account).
class InstanceTagObserver final : public RunObserver {
 public:
  explicit InstanceTagObserver(std::shared_ptr<GuestAttributesWriter> writer) : writer_(std::move(writer)) {}
  void OnChange(const RunView& view) override;
  void FinishBy(SteadyTime by) override { writer_->FinishBy(by); }

 private:
  std::shared_ptr<GuestAttributesWriter> writer_;
};

// systemd (Type=notify): STATUS= when the summary changes, STOPPING=1 once
// the run is ending, then EXTEND_TIMEOUT_USEC= every 10 s to cover the
// current state's own deadline (+15 s, at least 30 s), so systemd's stop
// timeout never cuts spotvisor's bounded work short.
class SystemdObserver final : public RunObserver {
 public:
  SystemdObserver(boost::asio::io_context& io, const Clock& clock, std::shared_ptr<ServiceNotifier> notifier)
      : clock_(clock), notifier_(std::move(notifier)), extend_timer_(io) {}
  void OnChange(const RunView& view) override;
  void Close() override;
  // The STATUS= text for a view (exposed for tests).
  static std::string Summary(const RunView& view);

 private:
  void Extend();

  const Clock& clock_;
  std::shared_ptr<ServiceNotifier> notifier_;
  boost::asio::steady_timer extend_timer_;
  std::string status_;  // the last STATUS= sent
  bool stopping_ = false;
  bool closed_ = false;
  std::optional<SteadyTime> deadline_;
};

}  // namespace spotvisor
