// The supervisor as an explicit state machine, s6-style: a table of
// (state x event) -> action rows, one deadline per state computed in one
// place (DeadlineFor), every transition through one function that logs it
// (Transition). It does no I/O: the driver (supervisor.cc) feeds it events
// from the event loop and carries out the actions it returns, so every path
// can be unit-tested with a hand-moved clock. docs/architecture.md's table is
// generated from the rows (TableMarkdown); a unit test keeps them equal.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "common/clock.h"
#include "log/logger.h"

namespace spotvisor {

enum class Phase {
  kStarting,   // config loaded; trainer not started yet
  kMounting,   // dataset disk, scratch disk, bucket FUSE mount
  kRestoring,  // putting the newest complete checkpoint back
  kForming,    // gang: waiting for every member (issue #16)
  kRunning,    // trainer running
  kStopping,   // stop ladder: SIGINT -> SIGTERM -> SIGKILL
  kDraining,   // trainer gone; stopping what it left behind
  kGangWaiting,  // gang: this member's trainer finished; waiting for the others'
  kRestarting, // restart=on-failure: sync, wait restart-delay, start again
  kSyncing,    // final checkpoint sync (and DONE after a success)
  kHolding,    // on-failure-hold: a failed run keeps the VM up for debugging
  kUnmounting, // undoing the mounts, in reverse order, before on-exit
  kFinishing,  // on-exit action (the Compute API, or the shutdown command)
  kPoweringOff,  // on-exit failed or hung: the shutdown command, retried; then by force
  kDone,
};
const char* PhaseName(Phase p);

// The machine's states: the phases, with their sub-states made explicit
// (which rung of a ladder, whether work was cancelled, what a restart still
// waits for). `status.json` and systemd show the phase; `supervisor.state`
// events name both.
enum class State {
  kStarting,
  kMounting,
  kMountsCancelled,    // the mount worker was told to stop: it gets a short time to unwind
  kRestoring,
  kRestoreCancelled,   // the downloads were cut short: the run ends once the worker returns
  kForming,            // gang: waiting for a generation with this member in it
  kRunning,
  kStoppingInt,        // SIGINT sent to the trainer's group
  kStoppingTerm,       // then SIGTERM
  kStoppingKill,       // then SIGKILL
  kDrainingTerm,       // SIGTERM to what the trainer left running
  kDrainingKill,       // then SIGKILL
  kGangLossCheck,      // gang: the trainer failed; was a member lost first? (its lease expires)
  kGangWaiting,        // gang: the trainer finished; waiting for the generation to end
  kRestartingSyncDelay,  // waiting for the restart's sync and for restart-delay
  kRestartingDelay,      // the sync is done (or none): waiting for restart-delay
  kRestartingSync,       // restart-delay is over: waiting for the sync
  kSyncing,
  kSyncCancelled,      // asked twice to stop: the final sync was cancelled
  kHolding,
  kUnmounting,
  kFinishing,
  kPoweringOff,
  kDone,
};
inline constexpr int kStateCount = static_cast<int>(State::kDone) + 1;
const char* StateName(State s);
Phase PhaseOf(State s);

enum class EndReason { kCompleted, kFailed, kPreempted, kMaintenance, kStopped, kAlreadyDone, kRestoreFailed, kMaxRuntime, kIdle, kMountFailed, kSyncStalled,
                       kGangEnded,       // another member ended the gang's generation
                       kGangFormFailed,  // the gang did not form (refused, or not within gang-form-timeout)
                       kSyncFailed,      // the trainer exited 0, but the final sync did not reach the bucket (exit 73)
                       kRunFailed,       // RUN_ID/FAILED: too many failed boots in a row (run/budget.h; exit 76)
                       kStopRequested,   // RUN_ID/STOP: `spotvisor stop` from a laptop (run/budget.h)
};
// How loud a run.end is: ERROR where the run's work is at risk or lost
// (failed, restore-failed, mount-failed, sync-failed, sync-stalled),
// WARNING where the run could not start (gang-form-failed), else NOTICE.
Severity EndSeverity(EndReason r);
const char* EndReasonName(EndReason r);

// Events.
struct StartEvent {
  bool already_preempted = false;
  bool maintenance_terminate = false;
};
struct TrainerSpawned { int pid; };
struct TrainerSpawnFailed { std::string error; int exit_code; };
// The trainer's process group leader was reaped. `group_remaining` counts
// processes still in its group (a shell killed by SIGINT may leave the real
// trainer still saving its checkpoint).
struct TrainerExited { int pid; int exit_code; int signal; int group_remaining = 0; };
struct GroupEmpty {};  // the last member of the trainer's process group is gone
// `ends_at`: when the cloud takes the machine, if the notice says (EC2's
// instance-action time): the final sync must be committed before it.
// `what`: the notice, for the log ("" : GCE's instance/preempted).
struct PreemptionNotice {
  std::optional<SteadyTime> ends_at;
  std::string what;
};
struct MaintenanceNotice { std::string value; };
struct StopSignal { int signo; };
struct LeftoversGone {};
struct OnExitDone { int exit_code; };
struct DeadlineReached {};
struct RestoreDone {
  bool ok = true;
  bool already_done = false;  // DONE found: do not train again
  bool resumed = false;
  std::string error;
  bool run_failed = false;  // FAILED found (run/budget.h): do not train again
  bool run_stopped = false;  // STOP found (`spotvisor stop`): do not train again
};
struct Release {};
struct MountsDone {
  bool ok = true;
  std::string error;
};
struct UnmountsDone {
  std::vector<std::string> problems;  // empty: everything unmounted cleanly
};
struct IdleTimeout { std::chrono::milliseconds idle; };  // idle-timeout expired  // `spotvisor release`: end an on-failure-hold now
struct SyncDone {
  bool ok = true;
  bool final = true;  // false: the sync before a restart
};
// sync-stall-action = stop: checkpoints have not reached the bucket for
// twice sync-alert-after (the supervisor logged `sync.stalled` with the cause).
struct SyncStalled {};
// instance/upcoming-maintenance, reduced by the supervisor to when the
// trainer must stop (windowStartTime - maintenance-stop-before) for a
// maintenance that will terminate the VM; nullopt: nothing (any more).
struct MaintenanceWindow { std::optional<SteadyTime> stop_at; };
// Gang training (issue #16): a generation with this member in it is in
// force. `writes_checkpoints`: this member syncs (gang-checkpoint = leader:
// rank 0 only); the others only restore.
struct GangFormed {
  std::int64_t generation = 0;
  int rank = 0;
  bool writes_checkpoints = true;
};
// The gang cannot form: the members disagree, the name is taken.
struct GangFormFailed { std::string error; };
// The generation this member is in ended; `completed`: every member's
// trainer exited 0.
struct GangEnded {
  std::int64_t generation = 0;
  std::string reason;
  bool completed = false;
  bool member_failed = false;  // the member that ended it did so because its own trainer failed
};
// `spotvisor stop` wrote RUN_ID/STOP (seen by the stop-check-interval poll).
struct StopRequested {
  std::string by;  // who asked, from the marker
};
using Event = std::variant<StartEvent, TrainerSpawned, TrainerSpawnFailed, TrainerExited, GroupEmpty,
                           PreemptionNotice, MaintenanceNotice, StopSignal, LeftoversGone, OnExitDone, DeadlineReached, RestoreDone, SyncDone, Release, IdleTimeout, MountsDone, UnmountsDone, SyncStalled, MaintenanceWindow,
                           GangFormed, GangFormFailed, GangEnded, StopRequested>;

// Actions.
struct StartRestore {};
struct SpawnTrainer {
  bool resumed = false;
  int restart_count = 0;
};
struct SyncNow { std::string kind; };  // a non-final sync: "restart", "maintenance"
// DONE only after a clean exit. `deadline`: when the sync must be over
// (inside the Spot window when preempted); `urgent`: retry quickly within it.
struct StartFinalSync {
  bool write_done = false;
  SteadyTime deadline{};
  bool urgent = false;
};
struct SignalTrainer { int signo; };    // to the trainer's whole process group
struct SignalLeftovers { int signo; };  // every remaining descendant
struct RunOnExit {};
struct CancelOnExit {};   // the on-exit action hung: abandon it (cancel the API call, kill the command)
struct RunPoweroff { int attempt = 1; };  // shutdown-command, whatever on-exit was
struct ForcePoweroff {};  // last resort: reboot(2) in daemon mode
struct StartMounts {};
struct CancelMounts {};  // the mounting phase ran out of time, or a stop: cut waits short
struct CancelRestore {};    // stopped or preempted while restoring: cut the downloads short
struct CancelFinalSync {};  // asked a second time to stop: the final sync ends now
struct StartUnmounts {};
struct ExitProcess { int code; };
struct StartForming {};   // gang: join and wait for the generation
struct CancelForming {};  // gang: stop waiting (the run ends before the trainer)
// gang: this member's trouble ends the generation for everyone.
struct EndGang {
  std::string why;
  bool failed = false;  // this member's own trainer failed (recorded with the end)
};  // "was preempted": the driver puts the member's name before it
struct GangDone {};  // gang: this member's trainer exited 0
using Action = std::variant<StartRestore, SpawnTrainer, SignalTrainer, SignalLeftovers, StartFinalSync, SyncNow, RunOnExit,
                            ExitProcess, StartMounts, CancelMounts, StartUnmounts, CancelRestore, CancelFinalSync,
                            CancelOnExit, RunPoweroff, ForcePoweroff, StartForming, CancelForming, EndGang, GangDone>;

struct StateMachineOptions {
  std::chrono::milliseconds stop_timeout{20'000};
  std::chrono::milliseconds kill_timeout{5'000};
  // After SIGKILL, how long to wait before giving up on a process stuck in
  // the kernel (D state) and finishing anyway.
  std::chrono::milliseconds kill_grace{5'000};
  // The whole on-exit budget: the action gets half, then shutdown-command
  // is run (and retried) in what is left, then the VM is powered off by force.
  std::chrono::milliseconds on_exit_timeout{60'000};
  int poweroff_attempts = 3;
  bool run_on_exit = false;  // on-exit = poweroff
  // In a group (issue #30): a completed run leaves it even after a
  // preemption or a stop signal (on-exit is otherwise skipped then).
  bool leave_group_when_done = false;
  bool sync = false;         // a bucket is configured: restore first, sync last
  std::chrono::milliseconds restore_timeout{30 * 60'000};
  std::chrono::milliseconds final_sync_timeout{10 * 60'000};
  // GCE powers a preempted VM off this long after the ACPI power button; the
  // final sync must be over `final_sync_margin` before that (log delivery,
  // unmounts).
  std::chrono::milliseconds preemption_window{30'000};
  std::chrono::milliseconds final_sync_margin{3'000};
  // Run policies (issue #7).
  bool restart_on_failure = false;
  int max_restarts = 3;
  std::chrono::milliseconds restart_delay{10'000};
  std::chrono::milliseconds restart_delay_max{5 * 60'000};
  std::chrono::milliseconds quick_crash{60'000};  // a crash sooner than this after start doubles the delay
  int max_quick_crashes = 5;                       // that many in a row: a crash loop, no more restarts
  std::chrono::milliseconds max_runtime{0};       // from spotvisor's start; 0: none
  std::chrono::milliseconds maintenance_stop_lead{0};
  // A VM created with --preemption-notice-duration sees preempted=TRUE that
  // long before the power button: sync at once, stop the trainer this much later.
  std::chrono::milliseconds preemption_stop_lead{0};
  // The VM's --preemption-notice-duration: the power button comes this long
  // after preempted=TRUE (0: unknown; then preemption_stop_lead is taken as it).
  std::chrono::milliseconds preemption_notice{0};
  std::chrono::milliseconds on_failure_hold{0};  // 0: no hold
  // Mounts (issue #4): before restore, undone before on-exit.
  bool mounts = false;
  std::chrono::milliseconds mount_timeout{15 * 60'000};    // the whole mounting phase
  std::chrono::milliseconds unmount_timeout{2 * 60'000};   // the whole unmounting phase
  // Gang training (issue #16): form after the restore, before the trainer.
  bool gang = false;
  // How long forming may take; also how long a member whose trainer
  // finished waits for the others' to finish.
  std::chrono::milliseconds gang_form_timeout{10 * 60'000};
  // gang-on-loss = wait: a member that was stopped because another was
  // lost restores and forms again (within gang_reform_timeout) instead of
  // ending its run.
  bool gang_wait = false;
  // gang-checkpoint = all: a member restores its rank's share only once
  // the gang formed (the rank decides what it restores), also on first boot.
  bool gang_restore_after_forming = false;
  // A member restores (again) once the gang formed, also on first boot: rank
  // 0's final commit of the last generation is in the bucket only then (its
  // restore at boot stays: it finds DONE without waiting for the others).
  bool gang_restore_on_forming = false;
  std::chrono::milliseconds gang_reform_timeout{30 * 60'000};
  // A trainer that fails in a formed gang, with no end of the generation
  // heard yet, waits this long for one (issue #28): a peer killed without a
  // word takes the collective down at once (gloo's "Connection closed by
  // peer"), while etcd says the peer is gone only when its lease expires.
  // The lease TTL and a margin.
  std::chrono::milliseconds gang_loss_grace{15'000};
};

class StateMachine {
 public:
  using Emit = std::function<void(LogEvent)>;
  StateMachine(StateMachineOptions options, Emit emit) : options_(options), emit_(std::move(emit)) {}

  std::vector<Action> Handle(const Event& event, SteadyTime now);

  State state() const { return state_; }
  Phase phase() const { return PhaseOf(state_); }
  std::optional<SteadyTime> deadline() const { return deadline_; }
  int trainer_pid() const { return trainer_pid_; }
  std::optional<EndReason> end_reason() const { return reason_; }
  int exit_code() const { return exit_code_; }
  // The signal the trainer died of (0: it exited on its own, or never ran).
  int trainer_signal() const { return trainer_signal_; }
  // 0 while not stopping; else the last signal sent to the trainer.
  int stop_signal() const { return stop_signal_; }
  // True once the group leader is reaped (its group may still have members).
  bool leader_exited() const { return leader_exited_; }
  int restarts() const { return restarts_; }
  // SIGINT/SIGTERM reached spotvisor (systemd stopping it, often the system going down).
  bool stopped_by_signal() const { return signalled_; }
  // instance/preempted was seen TRUE at some point.
  bool preempted() const { return preempted_; }
  // After a preemption: by when the run's last records (the boot record's
  // end, the claim's release) must be done, half the final sync's margin
  // before the machine is taken, so that spotvisor exits inside the window
  // whatever the store does. nullopt: not preempted.
  std::optional<SteadyTime> RecordsDeadline(SteadyTime now) const;
  // After a preemption: when the cloud takes the machine (the power button
  // plus preemption-window, or an EC2 notice's time); nullopt otherwise.
  std::optional<SteadyTime> WindowEnd(SteadyTime now) const;
  // The run is over or being ended (not a crash that may be restarted, not a
  // hold): what systemd hears as STOPPING=1.
  bool Ending() const;

  // The states (with their deadlines) and the transition table, as the
  // Markdown in docs/architecture.md.
  static std::string TableMarkdown();

 private:
  struct Row;
  static const std::vector<Row>& Table();
  // The one way to change state: sets the state's deadline (DeadlineFor)
  // and logs one supervisor.state event.
  void Transition(State to, SteadyTime now, const std::string& why);
  // Each state's one deadline, computed here only.
  std::optional<SteadyTime> DeadlineFor(State s, SteadyTime now) const;
  // The final sync's budget: final-sync-timeout, or what is left of the
  // Spot window (urgent) after a preemption.
  std::pair<std::chrono::milliseconds, bool> FinalSyncBudget(SteadyTime now) const;

  // Row handlers.
  void OnStart(const StartEvent& e, SteadyTime now, std::vector<Action>& out);
  void OnMountsDone(const MountsDone& e, SteadyTime now, std::vector<Action>& out);
  void OnRestoreDone(const RestoreDone& e, SteadyTime now, std::vector<Action>& out);
  void OnSpawned(const TrainerSpawned& e, SteadyTime now);
  void NotePreemption(const PreemptionNotice& e, SteadyTime now);
  void NoteStopSignal(const StopSignal& e, SteadyTime now);
  void OnMaintenanceRunning(SteadyTime now, std::vector<Action>& out);
  void OnMaintenanceWindow(const MaintenanceWindow& e, SteadyTime now, std::vector<Action>& out);
  void OnOnExitDone(const OnExitDone& e, SteadyTime now, std::vector<Action>& out);
  void OnRunningDeadline(SteadyTime now, std::vector<Action>& out);
  void OnRestartDeadline(SteadyTime now, std::vector<Action>& out);
  void EndedBeforeTrainer(int signo_or_zero);
  void BeginStop(EndReason reason, SteadyTime now, std::vector<Action>& out);
  void Escalate(SteadyTime now, std::vector<Action>& out, const std::string& why);
  void Finish(SteadyTime now, std::vector<Action>& out);
  void RunOnExitNow(SteadyTime now, std::vector<Action>& out);
  // Unmount what was mounted (if anything), then on-exit or exit.
  void Teardown(SteadyTime now, std::vector<Action>& out, bool then_on_exit);
  void AfterTeardown(SteadyTime now, std::vector<Action>& out);
  // No on-exit after a stop signal (the system is going down) or a preemption
  // (GCE stops or deletes the VM itself).
  bool OnExitVetoed() const;
  void SkipOnExit();
  void AfterMounts(SteadyTime now, std::vector<Action>& out);
  void OnTrainerExited(const TrainerExited& e, SteadyTime now, std::vector<Action>& out);
  void BeginDraining(SteadyTime now, std::vector<Action>& out);
  void AfterDraining(SteadyTime now, std::vector<Action>& out);
  bool MayBeGangLoss() const;
  bool AwaitLoss(SteadyTime now, std::vector<Action>& out);
  void AfterLossCheck(SteadyTime now, std::vector<Action>& out);
  void Conclude(SteadyTime now, std::vector<Action>& out);
  bool MaybeRestart(SteadyTime now, std::vector<Action>& out);
  void StopFromIdle(EndReason reason, SteadyTime now, std::vector<Action>& out);
  void LogStopRequested(const StopRequested& e);
  // A notice with a lead: sync now, stop the trainer at now + lead.
  void ScheduleStop(EndReason reason, std::chrono::milliseconds lead, SteadyTime now, std::vector<Action>& out);
  void Log(Severity s, const char* event, std::string message, nlohmann::json fields = nlohmann::json::object());
  // Issues StartFinalSync and enters kSyncing.
  void BeginFinalSync(bool write_done, SteadyTime now, const std::string& why, std::vector<Action>& out);
  void CutShortBeforeTrainer(SteadyTime now, std::vector<Action>& out);
  // on-exit failed or hung: shutdown-command (again), or by force.
  void PowerOff(SteadyTime now, const std::string& why, std::vector<Action>& out);
  // This member syncs checkpoints (no gang, or the gang's checkpoint writer).
  bool Syncs() const { return options_.sync && sync_writes_; }
  // Gang: the generation ends for everyone with this member's reason,
  // once, and only while one is in force.
  void EndGangFor(EndReason reason, std::vector<Action>& out);
  void OnGangEnded(const GangEnded& e, SteadyTime now, std::vector<Action>& out);
  void FormOrSpawn(bool resumed, SteadyTime now, std::vector<Action>& out);
  // The run ends while forming (a timeout, a notice, a signal): stop waiting, then Finish.
  void StopForming(EndReason reason, int exit_code, SteadyTime now, std::vector<Action>& out);
  // After the trainer is gone and before the final sync: a gang member whose
  // trainer finished waits for the others'.
  bool AwaitGang(SteadyTime now, std::vector<Action>& out);
  void AfterGang(SteadyTime now, std::vector<Action>& out);
  // gang-on-loss = wait: this member's run ended only because another was lost.
  bool ReformAfterLoss() const;
  void Reform(SteadyTime now, std::vector<Action>& out, const std::string& why);
  // restart-delay is over (and the restart's sync): spawn, or in a gang form again.
  void RestartNow(SteadyTime now, std::vector<Action>& out);

  StateMachineOptions options_;
  Emit emit_;
  State state_ = State::kStarting;
  std::optional<SteadyTime> deadline_;
  std::optional<EndReason> reason_;
  int trainer_pid_ = 0;
  int exit_code_ = 0;
  int trainer_signal_ = 0;
  std::chrono::milliseconds gang_waited_{0};  // in gang-waiting: how long, said every gang-form-timeout
  int stop_signal_ = 0;
  SteadyTime started_{}, trainer_started_{};
  bool trainer_ran_ = false;
  bool leader_exited_ = false;
  int restarts_ = 0;
  int quick_streak_ = 0;  // consecutive crashes soon after start
  SteadyTime restart_at_{};  // when restart-delay is over
  std::optional<SteadyTime> max_runtime_at_;
  std::optional<SteadyTime> scheduled_stop_at_;  // after a notice with a lead
  std::optional<SteadyTime> window_stop_at_;     // from upcoming-maintenance's window
  bool scheduled_by_window_ = false;             // scheduled_stop_at_ came from it
  EndReason scheduled_reason_ = EndReason::kMaintenance;
  bool on_exit_started_ = false;
  SteadyTime on_exit_deadline_{};  // the end of the whole on-exit budget
  SteadyTime final_sync_end_{};    // the final sync's deadline
  int poweroff_attempts_ = 0;
  int stop_signals_ = 0;     // SIGINT/SIGTERM/SIGHUP/SIGQUIT to spotvisor so far
  bool signalled_ = false;  // SIGINT/SIGTERM to spotvisor: no on-exit, a second one escalates
  bool preempted_ = false;  // any PreemptionNotice: no on-exit, no restart
  std::string preemption_what_;  // the notice's own words (EC2's), empty for GCE's
  std::optional<SteadyTime> power_button_at_;  // when GCE pressed (or will press) it
  std::optional<SteadyTime> stop_signal_at_;   // the first SIGINT/SIGTERM to spotvisor
  bool mounts_active_ = false;   // StartMounts was issued and not undone yet
  bool on_exit_after_teardown_ = false;
  // Gang.
  bool gang_formed_ = false;     // a generation with this member is (or was) in force
  bool gang_ended_ = false;      // and it has ended (or this member ended it)
  bool gang_completed_ = false;  // it ended because every trainer finished
  bool gang_end_failed_ = false;  // it ended because a member's own trainer failed
  bool sync_writes_ = true;      // false: a gang member that only restores
  bool restore_resumed_ = false;
  bool reforming_ = false;  // forming again after a loss: gang_reform_timeout
};

}  // namespace spotvisor
