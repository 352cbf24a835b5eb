#include "supervisor/state_machine.h"

#include <csignal>
#include <cstring>

#include <fmt/format.h>

#include "common/duration.h"

namespace spotvisor {
namespace {

// EX_TEMPFAIL: nothing failed, but nothing ran; try again on a new VM.
constexpr int kExitPreemptedBeforeStart = 75;
// EX_IOERR: the checkpoint could not be restored, so the trainer never ran.
constexpr int kExitRestoreFailed = 74;
// EX_CANTCREAT: the trainer succeeded but its results did not reach the bucket.
constexpr int kExitSyncFailed = 73;
// EX_OSFILE: a disk or the bucket could not be mounted, so the trainer never ran.
constexpr int kExitMountFailed = 72;
// The run is marked failed (RUN_ID/FAILED, run/budget.h): the trainer never ran.
constexpr int kExitRunFailed = 76;
// EX_CONFIG: the gang's members disagree (size, command) or a name is taken.
constexpr int kExitGangRefused = 78;

template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

std::string SignalName(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGKILL: return "SIGKILL";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    default: return fmt::format("signal {}", sig);
  }
}

double Seconds(SteadyTime::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

const char* PhaseName(Phase p) {
  switch (p) {
    case Phase::kStarting: return "starting";
    case Phase::kMounting: return "mounting";
    case Phase::kUnmounting: return "unmounting";
    case Phase::kRestoring: return "restoring";
    case Phase::kForming: return "forming";
    case Phase::kRunning: return "running";
    case Phase::kStopping: return "stopping";
    case Phase::kDraining: return "draining";
    case Phase::kGangWaiting: return "gang-waiting";
    case Phase::kRestarting: return "restarting";
    case Phase::kSyncing: return "syncing";
    case Phase::kHolding: return "holding";
    case Phase::kFinishing: return "finishing";
    case Phase::kPoweringOff: return "powering-off";
    case Phase::kDone: return "done";
  }
  return "?";
}

const char* EndReasonName(EndReason r) {
  switch (r) {
    case EndReason::kCompleted: return "completed";
    case EndReason::kFailed: return "failed";
    case EndReason::kPreempted: return "preempted";
    case EndReason::kMaintenance: return "maintenance";
    case EndReason::kStopped: return "stopped";
    case EndReason::kAlreadyDone: return "already-done";
    case EndReason::kRestoreFailed: return "restore-failed";
    case EndReason::kMaxRuntime: return "max-runtime";
    case EndReason::kIdle: return "idle";
    case EndReason::kMountFailed: return "mount-failed";
    case EndReason::kSyncStalled: return "sync-stalled";
    case EndReason::kGangEnded: return "gang-ended";
    case EndReason::kGangFormFailed: return "gang-form-failed";
    case EndReason::kSyncFailed: return "sync-failed";
    case EndReason::kRunFailed: return "run-failed";
    case EndReason::kStopRequested: return "stop-requested";
  }
  return "?";
}

Severity EndSeverity(EndReason r) {
  switch (r) {
    case EndReason::kFailed:
    case EndReason::kRestoreFailed:
    case EndReason::kMountFailed:
    case EndReason::kSyncFailed:
    case EndReason::kRunFailed:
    case EndReason::kSyncStalled: return Severity::kError;
    case EndReason::kGangFormFailed: return Severity::kWarning;
    default: return Severity::kNotice;
  }
}

const char* StateName(State s) {
  switch (s) {
    case State::kStarting: return "starting";
    case State::kMounting: return "mounting";
    case State::kMountsCancelled: return "mounting/cancelled";
    case State::kRestoring: return "restoring";
    case State::kRestoreCancelled: return "restoring/cancelled";
    case State::kForming: return "forming";
    case State::kRunning: return "running";
    case State::kStoppingInt: return "stopping/SIGINT";
    case State::kStoppingTerm: return "stopping/SIGTERM";
    case State::kStoppingKill: return "stopping/SIGKILL";
    case State::kDrainingTerm: return "draining/SIGTERM";
    case State::kDrainingKill: return "draining/SIGKILL";
    case State::kGangLossCheck: return "gang-waiting/loss?";
    case State::kGangWaiting: return "gang-waiting";
    case State::kRestartingSyncDelay: return "restarting/sync+delay";
    case State::kRestartingDelay: return "restarting/delay";
    case State::kRestartingSync: return "restarting/sync";
    case State::kSyncing: return "syncing";
    case State::kSyncCancelled: return "syncing/cancelled";
    case State::kHolding: return "holding";
    case State::kUnmounting: return "unmounting";
    case State::kFinishing: return "finishing";
    case State::kPoweringOff: return "powering-off";
    case State::kDone: return "done";
  }
  return "?";
}

Phase PhaseOf(State s) {
  switch (s) {
    case State::kStarting: return Phase::kStarting;
    case State::kMounting:
    case State::kMountsCancelled: return Phase::kMounting;
    case State::kRestoring:
    case State::kRestoreCancelled: return Phase::kRestoring;
    case State::kForming: return Phase::kForming;
    case State::kRunning: return Phase::kRunning;
    case State::kStoppingInt:
    case State::kStoppingTerm:
    case State::kStoppingKill: return Phase::kStopping;
    case State::kDrainingTerm:
    case State::kDrainingKill: return Phase::kDraining;
    case State::kGangLossCheck:
    case State::kGangWaiting: return Phase::kGangWaiting;
    case State::kRestartingSyncDelay:
    case State::kRestartingDelay:
    case State::kRestartingSync: return Phase::kRestarting;
    case State::kSyncing:
    case State::kSyncCancelled: return Phase::kSyncing;
    case State::kHolding: return Phase::kHolding;
    case State::kUnmounting: return Phase::kUnmounting;
    case State::kFinishing: return Phase::kFinishing;
    case State::kPoweringOff: return Phase::kPoweringOff;
    case State::kDone: return Phase::kDone;
  }
  return Phase::kDone;
}

void StateMachine::Log(Severity s, const char* event, std::string message, nlohmann::json fields) {
  if (emit_) emit_(LogEvent{s, event, std::move(message), std::move(fields)});
}

// ---------------------------------------------------------------- the table

namespace {

using StateSet = std::uint32_t;
static_assert(kStateCount <= 32);
constexpr StateSet Bit(State s) { return StateSet{1} << static_cast<int>(s); }
template <class... S>
constexpr StateSet In(S... s) { return (Bit(s) | ...); }
constexpr StateSet kAnyState = (StateSet{1} << kStateCount) - 1;
constexpr StateSet kStopping = In(State::kStoppingInt, State::kStoppingTerm, State::kStoppingKill);
constexpr StateSet kDraining = In(State::kDrainingTerm, State::kDrainingKill);
constexpr StateSet kRestarting = In(State::kRestartingSyncDelay, State::kRestartingDelay, State::kRestartingSync);
// Before the trainer: where it may be spawned from.
constexpr StateSet kSpawnable = In(State::kStarting, State::kMounting, State::kRestoring, State::kForming) | kRestarting;

// Names of the events, in the order of the Event variant.
constexpr const char* kEventNames[] = {"StartEvent",      "TrainerSpawned",  "TrainerSpawnFailed", "TrainerExited",
                                       "GroupEmpty",      "PreemptionNotice", "MaintenanceNotice", "StopSignal",
                                       "LeftoversGone",   "OnExitDone",      "DeadlineReached",    "RestoreDone",
                                       "SyncDone",        "Release",         "IdleTimeout",        "MountsDone",
                                       "UnmountsDone",    "SyncStalled",     "MaintenanceWindow",  "GangFormed",
                                       "GangFormFailed",  "GangEnded",        "StopRequested"};
static_assert(std::size(kEventNames) == std::variant_size_v<Event>);

template <class E>
std::size_t EventIndex() {
  return Event(std::in_place_type<E>).index();
}

// A mounting or restoring worker told to stop gets this long to return.
constexpr std::chrono::milliseconds kCancelGrace{10'000};

bool Terminates(const MaintenanceNotice& e) { return e.value == "TERMINATE_ON_HOST_MAINTENANCE"; }

}  // namespace

struct StateMachine::Row {
  StateSet states;
  std::size_t event;
  // Notes hold in every state and run before the state's own row.
  bool note;
  std::function<void(StateMachine&, const Event&, SteadyTime, std::vector<Action>&)> fn;
  const char* does;
};

namespace {
template <class E, class F>
auto Rule(F f) {
  return [f](StateMachine& m, const Event& e, SteadyTime now, std::vector<Action>& out) { f(m, std::get<E>(e), now, out); };
}
}  // namespace

// Rows are matched in order: every note for the event, then the first row
// whose states hold the current state. An event no row takes is ignored.
const std::vector<StateMachine::Row>& StateMachine::Table() {
  using S = State;
  using Out = std::vector<Action>;
  using M = StateMachine;
  static const std::vector<Row> rows = [] {
    std::vector<Row> t;
    auto on = [&t](StateSet states, auto tag, const char* does, auto f) {
      using E = typename decltype(tag)::type;
      t.push_back(Row{states, EventIndex<E>(), false, Rule<E>(f), does});
    };
    auto note = [&t](auto tag, const char* does, auto f) {
      using E = typename decltype(tag)::type;
      t.push_back(Row{kAnyState, EventIndex<E>(), true, Rule<E>(f), does});
    };
    auto start = std::type_identity<StartEvent>{};
    auto mounts = std::type_identity<MountsDone>{};
    auto unmounts = std::type_identity<UnmountsDone>{};
    auto restored = std::type_identity<RestoreDone>{};
    auto spawned = std::type_identity<TrainerSpawned>{};
    auto spawn_failed = std::type_identity<TrainerSpawnFailed>{};
    auto exited = std::type_identity<TrainerExited>{};
    auto group_empty = std::type_identity<GroupEmpty>{};
    auto preempted = std::type_identity<PreemptionNotice>{};
    auto maintenance = std::type_identity<MaintenanceNotice>{};
    auto signal = std::type_identity<StopSignal>{};
    auto idle = std::type_identity<IdleTimeout>{};
    auto requested = std::type_identity<StopRequested>{};
    auto stalled = std::type_identity<SyncStalled>{};
    auto window = std::type_identity<MaintenanceWindow>{};
    auto release = std::type_identity<Release>{};
    auto leftovers = std::type_identity<LeftoversGone>{};
    auto synced = std::type_identity<SyncDone>{};
    auto on_exit = std::type_identity<OnExitDone>{};
    auto deadline = std::type_identity<DeadlineReached>{};
    auto formed = std::type_identity<GangFormed>{};
    auto form_failed = std::type_identity<GangFormFailed>{};
    auto gang_ended = std::type_identity<GangEnded>{};

    // Notes: facts that hold whatever the state.
    note(preempted, "remember the preemption (no on-exit, no restart) and when the power button comes; log `preemption.detected`",
         [](M& m, const PreemptionNotice& e, SteadyTime now, Out&) { m.NotePreemption(e, now); });
    note(signal, "remember the stop (no on-exit; a second one shortens what is left); log `signal.received`",
         [](M& m, const StopSignal& e, SteadyTime now, Out&) { m.NoteStopSignal(e, now); });
    note(maintenance, "log `maintenance.detected` (TERMINATE_ON_HOST_MAINTENANCE) or `maintenance.event` (anything else: ignored)",
         [](M& m, const MaintenanceNotice& e, SteadyTime, Out&) {
           if (Terminates(e)) return;
           m.Log(Severity::kInfo, "maintenance.event", fmt::format("maintenance-event is {}", e.value), {{"value", e.value}});
         });

    // Starting and mounting.
    on(In(S::kStarting), start,
       "`preempted` already TRUE or TERMINATE maintenance: the run ends without a trainer (exit 75); "
       "mounts configured → `mounting`; a `bucket` → `restoring`; else spawn the trainer",
       [](M& m, const StartEvent& e, SteadyTime now, Out& out) { m.OnStart(e, now, out); });
    on(In(S::kStarting), signal, "the run ends (`stopped`, exit 128+signal) without a trainer",
       [](M& m, const StopSignal& e, SteadyTime now, Out& out) {
         m.reason_ = EndReason::kStopped;
         m.exit_code_ = 128 + e.signo;
         m.Finish(now, out);
       });
    on(In(S::kMounting, S::kMountsCancelled), mounts,
       "failed: `mount.failed`, the run ends `mount-failed` (exit 72); a preemption, maintenance or stop meanwhile: "
       "the run ends without a trainer; else `restoring` with a `bucket`, or spawn the trainer",
       [](M& m, const MountsDone& e, SteadyTime now, Out& out) { m.OnMountsDone(e, now, out); });
    on(In(S::kMounting), deadline,
       "`mount.failed` (mount-timeout): cancel the mount worker → `mounting/cancelled`; the run ends `mount-failed` (exit 72)",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         if (!m.reason_) {
           m.reason_ = EndReason::kMountFailed;
           m.exit_code_ = kExitMountFailed;
         }
         std::string error = fmt::format("mounting did not finish within {}", FormatDuration(m.options_.mount_timeout));
         m.Log(Severity::kError, "mount.failed", error + "; not starting the trainer", {{"error", error}});
         out.push_back(CancelMounts{});
         m.Transition(S::kMountsCancelled, now, "cancelling the mounts");
       });
    on(In(S::kMountsCancelled), deadline,
       "`mount.stuck`: the worker did not return; what it mounted cannot be known, so the run ends without unmounting",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kError, "mount.stuck", "the mount step did not return after being cancelled; finishing without unmounting");
         m.mounts_active_ = false;
         m.Finish(now, out);
       });

    // Restoring.
    on(In(S::kRestoring, S::kRestoreCancelled), restored,
       "failed: the run ends `restore-failed` (exit 74: never start from scratch over a newer checkpoint); "
       "a DONE marker: `already-done`; a FAILED marker (too many failed boots in a row): `run-failed` (exit 76); a STOP "
       "marker (`spotvisor stop`): `stop-requested`; stopped or preempted meanwhile: the run ends without a trainer; else spawn the trainer",
       [](M& m, const RestoreDone& e, SteadyTime now, Out& out) { m.OnRestoreDone(e, now, out); });
    on(In(S::kRestoring), deadline, "`restore.failed` (restore did not finish in time): the run ends `restore-failed` (exit 74)",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.reason_ = EndReason::kRestoreFailed;
         m.exit_code_ = kExitRestoreFailed;
         m.Log(Severity::kError, "restore.failed", "restore did not finish in time; not starting the trainer");
         m.Finish(now, out);
       });
    on(In(S::kRestoreCancelled), deadline, "`restore.stuck`: the cancelled restore did not return; the run ends anyway",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kError, "restore.stuck", "the restore did not return after being cancelled; finishing without it");
         m.Finish(now, out);
       });
    on(In(S::kMounting, S::kRestoring), preempted,
       "the run ends without a trainer (exit 75): cancel the downloads → `restoring/cancelled`, or the mounts → "
       "`mounting/cancelled`",
       [](M& m, const PreemptionNotice&, SteadyTime now, Out& out) {
         if (m.reason_) return;
         m.reason_ = EndReason::kPreempted;
         m.exit_code_ = kExitPreemptedBeforeStart;  // also if the cancelled step never returns
         m.EndGangFor(EndReason::kPreempted, out);  // restoring after forming again
         m.CutShortBeforeTrainer(now, out);
       });
    on(In(S::kMounting, S::kRestoring), maintenance,
       "TERMINATE: the trainer will not be started (exit 75) once the step in progress returns",
       [](M& m, const MaintenanceNotice& e, SteadyTime, Out&) {
         if (Terminates(e) && !m.reason_) m.reason_ = EndReason::kMaintenance;
       });
    on(In(S::kMounting, S::kRestoring), signal,
       "the run ends (`stopped`, exit 128+signal) without a trainer: cancel the downloads or the mounts at once",
       [](M& m, const StopSignal& e, SteadyTime now, Out& out) {
         m.reason_ = EndReason::kStopped;
         m.exit_code_ = 128 + e.signo;
         m.EndGangFor(EndReason::kStopped, out);
         m.CutShortBeforeTrainer(now, out);
       });

    on(In(S::kRestoring), gang_ended,
       "gang: the generation ended while this member restored after forming: cancel the downloads → "
       "`restoring/cancelled`; no trainer starts in it (`gang-ended`, exit 75; gang-on-loss = wait: forming again)",
       [](M& m, const GangEnded&, SteadyTime now, Out& out) {
         // Found by the gang soak (issue #28): the restore went on and the
         // trainer started alone in a generation that had ended.
         if (!m.gang_formed_ || m.reason_) return;
         m.reason_ = EndReason::kGangEnded;
         m.exit_code_ = kExitPreemptedBeforeStart;
         m.CutShortBeforeTrainer(now, out);
       });

    // Forming the gang (issue #16).
    note(gang_ended,
         "gang: remember that the generation ended, whether every trainer finished, and whether a member ended it for "
         "its own trainer's failure",
         [](M& m, const GangEnded& e, SteadyTime, Out&) {
           if (!m.gang_formed_) return;
           if (!m.gang_ended_) m.gang_end_failed_ = e.member_failed;  // the first end heard is the one in force
           m.gang_ended_ = true;
           m.gang_completed_ = m.gang_completed_ || e.completed;
         });
    on(In(S::kForming), formed,
       "spawn the trainer (`gang.formed` logged); with a bucket, → `restoring` first, once formed, also on "
       "first boot (rank 0's newest commit, or with gang-checkpoint = all this rank's share of the newest complete "
       "set); a member that does not write checkpoints (gang-checkpoint = leader, rank > 0) will not sync",
       [](M& m, const GangFormed& e, SteadyTime now, Out& out) {
         m.gang_formed_ = true;
         m.sync_writes_ = e.writes_checkpoints;
         if ((m.reforming_ || m.options_.gang_restore_after_forming || m.options_.gang_restore_on_forming) &&
             m.options_.sync) {
           // Every member joined only once its final sync was over (a loss,
           // a re-formation), so the newest commit is in the bucket now.
           out.push_back(StartRestore{});
           m.Transition(State::kRestoring, now,
                        m.options_.gang_restore_after_forming
                            ? "formed: restoring this rank's share of the gang's newest complete checkpoint set"
                            : m.reforming_ ? "formed again: restoring the gang's newest checkpoint (rank 0's)"
                                           : "formed: restoring the gang's newest checkpoint (rank 0's), committed by now");
           return;
         }
         out.push_back(SpawnTrainer{m.reforming_ || m.restore_resumed_, m.restarts_});
       });
    on(In(S::kForming), form_failed, "the members disagree or the name is taken: the run ends `gang-form-failed` (exit 78)",
       [](M& m, const GangFormFailed&, SteadyTime now, Out& out) {
         m.reason_ = EndReason::kGangFormFailed;
         m.exit_code_ = kExitGangRefused;
         m.Finish(now, out);
       });
    on(In(S::kForming), deadline,
       "`gang.form_timeout`: stop waiting; the run ends `gang-form-failed` (exit 75) and on-exit runs, so no VM waits "
       "forever",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         std::string error =
             m.reforming_ ? fmt::format("the gang did not form again within {} (gang-reform-timeout)",
                                        FormatDuration(m.options_.gang_reform_timeout))
                          : fmt::format("the gang did not form within {} (gang-form-timeout)",
                                        FormatDuration(m.options_.gang_form_timeout));
         m.Log(Severity::kError, "gang.form_timeout", error + "; not starting the trainer", {{"error", error}});
         m.StopForming(EndReason::kGangFormFailed, kExitPreemptedBeforeStart, now, out);
       });
    on(In(S::kForming), preempted, "stop forming; the run ends without a trainer (exit 75)",
       [](M& m, const PreemptionNotice&, SteadyTime now, Out& out) {
         m.StopForming(EndReason::kPreempted, kExitPreemptedBeforeStart, now, out);
       });
    on(In(S::kForming), maintenance, "TERMINATE: stop forming; the run ends without a trainer (exit 75)",
       [](M& m, const MaintenanceNotice& e, SteadyTime now, Out& out) {
         if (!Terminates(e)) return;
         m.StopForming(EndReason::kMaintenance, kExitPreemptedBeforeStart, now, out);
       });
    on(In(S::kForming), signal, "stop forming; the run ends (`stopped`, exit 128+signal) without a trainer",
       [](M& m, const StopSignal& e, SteadyTime now, Out& out) {
         m.StopForming(EndReason::kStopped, 128 + e.signo, now, out);
       });

    // The trainer starts.
    on(kSpawnable, spawned, "→ `running`",
       [](M& m, const TrainerSpawned& e, SteadyTime now, Out&) { m.OnSpawned(e, now); });
    on(kSpawnable, spawn_failed, "`trainer.start_failed`: the run ends `failed` (126 or 127)",
       [](M& m, const TrainerSpawnFailed& e, SteadyTime now, Out& out) {
         m.reason_ = EndReason::kFailed;
         m.exit_code_ = e.exit_code;
         m.Log(Severity::kError, "trainer.start_failed", e.error, {{"exit_code", e.exit_code}});
         m.EndGangFor(EndReason::kFailed, out);
         m.Finish(now, out);
       });

    // Running.
    on(In(S::kRunning) | kStopping, exited,
       "the run's exit code is the trainer's; → `draining` (in `stopping`, only once its whole process group is gone)",
       [](M& m, const TrainerExited& e, SteadyTime now, Out& out) { m.OnTrainerExited(e, now, out); });
    on(In(S::kRunning), preempted,
       "SIGINT to the trainer's group → `stopping/SIGINT`; with `preemption-stop-lead`: sync now, stop at the lead time",
       [](M& m, const PreemptionNotice&, SteadyTime now, Out& out) {
         if (m.options_.preemption_stop_lead.count() > 0) {
           m.ScheduleStop(EndReason::kPreempted, m.options_.preemption_stop_lead, now, out);
         } else {
           m.BeginStop(EndReason::kPreempted, now, out);
         }
       });
    on(In(S::kRunning), maintenance,
       "TERMINATE: SIGINT to the trainer's group → `stopping/SIGINT`; with `maintenance-stop-lead`: sync now, stop at the lead time",
       [](M& m, const MaintenanceNotice& e, SteadyTime now, Out& out) {
         if (Terminates(e)) m.OnMaintenanceRunning(now, out);
       });
    on(In(S::kRunning), signal, "SIGINT to the trainer's group → `stopping/SIGINT` (`stopped`)",
       [](M& m, const StopSignal&, SteadyTime now, Out& out) { m.BeginStop(EndReason::kStopped, now, out); });
    on(In(S::kRunning), requested,
       "`run.stop_requested` (`spotvisor stop`): SIGINT to the trainer's group → `stopping/SIGINT` (`stop-requested`); "
       "the final sync, then on-exit (in a group: leave it)",
       [](M& m, const StopRequested& e, SteadyTime now, Out& out) {
         m.LogStopRequested(e);
         m.BeginStop(EndReason::kStopRequested, now, out);
       });
    on(In(S::kRunning), idle, "`idle.detected`: SIGINT to the trainer's group → `stopping/SIGINT` (`idle`)",
       [](M& m, const IdleTimeout& e, SteadyTime now, Out& out) {
         m.Log(Severity::kWarning, "idle.detected",
               fmt::format("the trainer has been idle for {}: ending the run", FormatDuration(e.idle)),
               {{"idle_s", std::chrono::duration<double>(e.idle).count()}});
         m.BeginStop(EndReason::kIdle, now, out);
       });
    note(window, "remember when upcoming-maintenance's window says the trainer must stop (a trainer started later gets it)",
         [](M& m, const MaintenanceWindow& e, SteadyTime, Out&) { m.window_stop_at_ = e.stop_at; });
    on(In(S::kRunning), window,
       "a terminating maintenance's window (`maintenance.scheduled`): sync now, stop at `maintenance-stop-before` the "
       "window (at once if that is past); a cleared or moved window replaces the stop it had set",
       [](M& m, const MaintenanceWindow& e, SteadyTime now, Out& out) { m.OnMaintenanceWindow(e, now, out); });
    on(In(S::kRunning), stalled,
       "sync-stall-action = stop (`sync.stalled` ERROR logged): SIGINT to the trainer's group → `stopping/SIGINT` "
       "(`sync-stalled`); on-exit runs",
       [](M& m, const SyncStalled&, SteadyTime now, Out& out) { m.BeginStop(EndReason::kSyncStalled, now, out); });
    on(In(S::kRunning), deadline,
       "the stop time of a notice with a lead, or `max-runtime` (`run.max_runtime`): SIGINT → `stopping/SIGINT`",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) { m.OnRunningDeadline(now, out); });
    on(In(S::kRunning), gang_ended,
       "gang: another member ended the generation (`gang.ended`): SIGINT to the trainer's group → `stopping/SIGINT` "
       "(`gang-ended`); after the final sync, on-exit (gang-on-loss = stop) or `forming` again (`gang.reforming`, "
       "gang-on-loss = wait). Ended as completed (gang-launch = leader: rank 0's command finished): SIGINT to this "
       "member's stand-in, and the run ends `completed`",
       [](M& m, const GangEnded& e, SteadyTime now, Out& out) { m.OnGangEnded(e, now, out); });

    // Stopping: the ladder for the trainer's whole process group.
    on(kStopping, group_empty, "the group leader had exited: → `draining/SIGTERM`",
       [](M& m, const GroupEmpty&, SteadyTime now, Out& out) {
         if (m.leader_exited_) m.BeginDraining(now, out);
       });
    on(kStopping | kDraining, preempted, "a stop by signal was the power button: the run ends `preempted`",
       [](M& m, const PreemptionNotice&, SteadyTime, Out&) {
         if (m.reason_ == EndReason::kStopped) m.reason_ = EndReason::kPreempted;
       });
    on(kStopping, signal,
       "the first one is logged (`signal.ignored`: GCE's power button comes with the preemption); a second one skips "
       "to the next rung",
       [](M& m, const StopSignal& e, SteadyTime now, Out& out) {
         if (m.stop_signals_ > 1) {
           m.Escalate(now, out, "asked again to stop");
         } else {
           m.Log(Severity::kInfo, "signal.ignored",
                 fmt::format("already stopping the trainer ({}): the stop ladder goes on as scheduled", EndReasonName(*m.reason_)),
                 {{"signal", SignalName(e.signo)}});
         }
       });
    on(In(S::kStoppingInt, S::kStoppingTerm), deadline, "the next signal: SIGTERM → `stopping/SIGTERM`, SIGKILL → `stopping/SIGKILL`",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Escalate(now, out,
                    fmt::format("trainer still running after {}",
                                FormatDuration(m.state_ == S::kStoppingInt ? m.options_.stop_timeout : m.options_.kill_timeout)));
       });
    on(In(S::kStoppingKill), deadline, "`trainer.unkillable` (stuck in the kernel): the run ends anyway",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) { m.Escalate(now, out, "still running after SIGKILL"); });

    // Draining: what the trainer left running.
    on(kDraining, leftovers,
       "a failed trainer that `restart = on-failure` allows → `restarting`; else the final sync (`syncing`) with a "
       "`bucket`, or the run ends",
       [](M& m, const LeftoversGone&, SteadyTime now, Out& out) { m.AfterDraining(now, out); });
    on(In(S::kDrainingTerm), deadline, "SIGKILL to the leftovers → `draining/SIGKILL`",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         out.push_back(SignalLeftovers{SIGKILL});
         m.Transition(S::kDrainingKill, now, "leftover processes ignored SIGTERM: SIGKILL");
       });
    on(In(S::kDrainingKill), deadline, "`trainer.leftovers` (they survive SIGKILL): go on as if they were gone",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kError, "trainer.leftovers", "leftover processes survive SIGKILL; finishing anyway");
         m.AfterDraining(now, out);
       });

    // A gang member whose trainer failed, before the gang said anything.
    on(In(S::kGangLossCheck), gang_ended,
       "the generation ended: a member lost (gone, preempted, stopped) means this trainer failed with it: "
       "`gang.loss_taken`, the run goes on as `gang-ended` (gang-on-loss = wait: forming again); a member whose own "
       "trainer failed: this one's failure stands; then as after draining",
       [](M& m, const GangEnded&, SteadyTime now, Out& out) { m.AfterLossCheck(now, out); });
    on(In(S::kGangLossCheck), deadline,
       "no member was lost: the trainer's own failure (`gang.no_loss`); then as after draining",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kInfo, "gang.no_loss",
               fmt::format("no member of the gang was lost within {} of the trainer's failure: it is this member's "
                           "own failure",
                           FormatDuration(m.options_.gang_loss_grace)),
               {{"waited_s", std::chrono::duration<double>(m.options_.gang_loss_grace).count()}});
         m.AfterLossCheck(now, out);
       });
    on(In(S::kGangLossCheck), preempted, "this member is going: stop waiting (no restart, no re-forming); then as after draining",
       [](M& m, const PreemptionNotice&, SteadyTime now, Out& out) { m.AfterLossCheck(now, out); });
    on(In(S::kGangLossCheck), maintenance, "TERMINATE: stop waiting; then as after draining",
       [](M& m, const MaintenanceNotice& e, SteadyTime now, Out& out) {
         if (Terminates(e)) m.AfterLossCheck(now, out);
       });
    on(In(S::kGangLossCheck), signal, "stop waiting (no restart, no re-forming); then as after draining",
       [](M& m, const StopSignal&, SteadyTime now, Out& out) { m.AfterLossCheck(now, out); });

    // A gang member whose trainer finished.
    on(In(S::kGangWaiting), gang_ended,
       "every trainer finished (`completed`): the final sync writes DONE; else the final sync without it (`gang-ended`)",
       [](M& m, const GangEnded&, SteadyTime now, Out& out) { m.AfterGang(now, out); });
    on(In(S::kGangWaiting), deadline,
       "`gang.still_waiting` (INFO), and wait on: the others are alive (a member that is gone, its lease expired, "
       "ends the generation by `GangEnded`), and busy (rank 0's evaluation or export after its last step); the "
       "deadline only says so every `gang-form-timeout`",
       [](M& m, const DeadlineReached&, SteadyTime now, Out&) {
         m.gang_waited_ += m.options_.gang_form_timeout;
         m.Log(Severity::kInfo, "gang.still_waiting",
               fmt::format("this member's trainer finished {} ago; the others' have not, and they are alive (their "
                           "leases are renewed): waiting on, as long as they are (a member that is gone ends the "
                           "generation)",
                           FormatDuration(m.gang_waited_)),
               {{"waited_s", std::chrono::duration<double>(m.gang_waited_).count()}});
         m.deadline_ = m.DeadlineFor(S::kGangWaiting, now);
       });
    on(In(S::kGangWaiting), preempted, "the generation ends (this member is going); the final sync without DONE",
       [](M& m, const PreemptionNotice&, SteadyTime now, Out& out) {
         m.reason_ = EndReason::kPreempted;
         m.EndGangFor(EndReason::kPreempted, out);
         m.AfterGang(now, out);
       });
    on(In(S::kGangWaiting), signal, "the generation ends (this member is going); the final sync without DONE",
       [](M& m, const StopSignal&, SteadyTime now, Out& out) {
         m.reason_ = EndReason::kStopped;
         m.EndGangFor(EndReason::kStopped, out);
         m.AfterGang(now, out);
       });

    // Restarting.
    on(In(S::kRestartingSyncDelay), synced, "the restart's sync is over → `restarting/delay`",
       [](M& m, const SyncDone& e, SteadyTime now, Out&) {
         if (!e.final) m.Transition(S::kRestartingDelay, now, "synced; waiting for restart-delay");
       });
    on(In(S::kRestartingSync), synced, "the restart's sync is over: spawn the trainer again (in a gang: form again)",
       [](M& m, const SyncDone& e, SteadyTime now, Out& out) {
         if (!e.final) m.RestartNow(now, out);
       });
    on(kRestarting, deadline,
       "`max-runtime` reached: no restart, the final sync or the end; else restart-delay is over: spawn the trainer, "
       "or → `restarting/sync` while its sync runs; there, `restart.sync_timeout`: spawn the trainer without it",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) { m.OnRestartDeadline(now, out); });
    on(kRestarting, preempted, "no restart: the final sync (`syncing`) with a `bucket`, or the run ends",
       [](M& m, const PreemptionNotice&, SteadyTime now, Out& out) { m.StopFromIdle(EndReason::kPreempted, now, out); });
    on(kRestarting, maintenance, "TERMINATE: no restart: the final sync (`syncing`) with a `bucket`, or the run ends",
       [](M& m, const MaintenanceNotice& e, SteadyTime now, Out& out) {
         if (Terminates(e)) m.StopFromIdle(EndReason::kMaintenance, now, out);
       });
    on(kRestarting, requested, "`run.stop_requested`: no restart: the final sync (`syncing`), then on-exit",
       [](M& m, const StopRequested& e, SteadyTime now, Out& out) {
         m.LogStopRequested(e);
         m.StopFromIdle(EndReason::kStopRequested, now, out);
       });
    on(kRestarting, signal, "no restart: the final sync (`syncing`) with a `bucket`, or the run ends",
       [](M& m, const StopSignal&, SteadyTime now, Out& out) { m.StopFromIdle(EndReason::kStopped, now, out); });

    // The final sync.
    on(In(S::kSyncing, S::kSyncCancelled), synced,
       "the run ends (a trainer that exited 0 but whose sync failed: `sync-failed`, exit 73)",
       [](M& m, const SyncDone& e, SteadyTime now, Out& out) {
         if (!e.final) return;
         if (!e.ok && *m.reason_ == EndReason::kCompleted) {
           // Issue #32: this said "completed" though the work never reached the bucket.
           m.reason_ = EndReason::kSyncFailed;
           m.exit_code_ = kExitSyncFailed;
         }
         m.Finish(now, out);
       });
    on(In(S::kSyncing), signal,
       "the first one is logged only (this is the sync the Spot window is for); a second one cancels it "
       "(`sync.cancelled`) → `syncing/cancelled`",
       [](M& m, const StopSignal& e, SteadyTime now, Out& out) {
         if (m.stop_signals_ < 2) return;
         m.Log(Severity::kWarning, "sync.cancelled", "asked again to stop: the final sync ends now", {{"signal", SignalName(e.signo)}});
         out.push_back(CancelFinalSync{});
         m.Transition(S::kSyncCancelled, now, "the final sync was cancelled");
       });
    on(In(S::kSyncing, S::kSyncCancelled), deadline,
       "`sync.timeout`: the run ends without it (a trainer that exited 0: `sync-failed`, exit 73)",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kError, "sync.timeout",
               m.state_ == S::kSyncing ? "the final sync did not finish in time; finishing without it"
                                       : "the cancelled final sync did not return; finishing without it");
         if (*m.reason_ == EndReason::kCompleted) {
           m.reason_ = EndReason::kSyncFailed;
           m.exit_code_ = kExitSyncFailed;
         }
         m.Finish(now, out);
       });

    // Holding, unmounting, on-exit.
    on(In(S::kHolding), release, "`run.released` (`spotvisor release`): on to on-exit",
       [](M& m, const Release&, SteadyTime now, Out& out) {
         m.Log(Severity::kNotice, "run.released", "hold released (spotvisor release): going on to on-exit");
         m.RunOnExitNow(now, out);
       });
    on(In(S::kHolding), deadline, "`run.hold_over`: on to on-exit",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kNotice, "run.hold_over", "on-failure-hold is over: going on to on-exit");
         m.RunOnExitNow(now, out);
       });
    on(In(S::kHolding), signal, "the hold ends, without on-exit (an operator stopping the service ends the hold, not the VM)",
       [](M& m, const StopSignal&, SteadyTime now, Out& out) {
         if (!m.reason_) m.reason_ = EndReason::kStopped;
         m.Teardown(now, out, false);
       });
    on(In(S::kUnmounting), unmounts, "`mount.unmount_problems` if any; → `finishing` (on-exit) or `done`",
       [](M& m, const UnmountsDone& e, SteadyTime now, Out& out) {
         if (!e.problems.empty()) {
           m.Log(Severity::kError, "mount.unmount_problems", fmt::format("{} mount(s) did not come off cleanly", e.problems.size()),
                 {{"problems", e.problems}});
         }
         m.AfterTeardown(now, out);
       });
    on(In(S::kUnmounting), deadline, "`mount.unmount_deadline`: go on (→ `finishing` or `done`)",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kError, "mount.unmount_deadline",
               fmt::format("unmounting did not finish within {}; going on", FormatDuration(m.options_.unmount_timeout)));
         m.AfterTeardown(now, out);
       });
    on(In(S::kFinishing, S::kPoweringOff), on_exit,
       "`shutdown.done`: succeeded → `done`; failed → `powering-off` (the next attempt), or by force after the last",
       [](M& m, const OnExitDone& e, SteadyTime now, Out& out) { m.OnOnExitDone(e, now, out); });
    on(In(S::kFinishing, S::kPoweringOff), deadline,
       "`shutdown.timeout`: abandon it (cancel the API call, kill the command) → `powering-off`, or by force "
       "(`shutdown.forced`) after the last attempt or 1 s before the budget ends",
       [](M& m, const DeadlineReached&, SteadyTime now, Out& out) {
         m.Log(Severity::kError, "shutdown.timeout",
               m.state_ == S::kFinishing ? "on-exit did not finish in time" : "shutdown-command did not finish in time");
         out.push_back(CancelOnExit{});
         m.PowerOff(now, "on-exit did not finish in time", out);
       });
    on(In(S::kFinishing, S::kPoweringOff), signal, "the system is going down (likely because spotvisor asked): → `done`, exit",
       [](M& m, const StopSignal&, SteadyTime now, Out& out) {
         m.Transition(S::kDone, now, "the system is going down");
         out.push_back(ExitProcess{m.exit_code_});
       });
    return t;
  }();
  return rows;
}

std::vector<Action> StateMachine::Handle(const Event& event, SteadyTime now) {
  std::vector<Action> out;
  if (state_ == State::kDone) return out;
  // A timer can fire late or for a deadline since replaced: only the
  // current state's deadline, once reached, counts.
  if (std::holds_alternative<DeadlineReached>(event) && (!deadline_ || now < *deadline_)) return out;
  State at = state_;
  for (auto const& row : Table()) {
    if (row.event != event.index() || !(row.states & Bit(at))) continue;
    row.fn(*this, event, now, out);
    if (!row.note) break;
  }
  return out;
}

void StateMachine::Transition(State to, SteadyTime now, const std::string& why) {
  State from = state_;
  state_ = to;
  deadline_ = DeadlineFor(to, now);
  // States, not phases: a phase is its states' name up to the first "/"
  // ("stopping/SIGINT" is in "stopping"), so a second pair of fields would
  // only repeat them.
  nlohmann::json f = {{"from", StateName(from)}, {"to", StateName(to)}, {"why", why}};
  if (deadline_) f["deadline_s"] = std::chrono::duration<double>(*deadline_ - now).count();
  Log(Severity::kInfo, "supervisor.state", fmt::format("{} -> {}: {}", StateName(from), StateName(to), why), f);
}

std::pair<std::chrono::milliseconds, bool> StateMachine::FinalSyncBudget(SteadyTime now) const {
  auto budget = options_.final_sync_timeout;
  if (!preempted_) return {budget, false};
  // The power button: GCE presses it with preempted=TRUE (or `lead` after
  // it); if spotvisor's SIGTERM came first, that was the button.
  auto button = power_button_at_.value_or(now);
  if (stop_signal_at_ && *stop_signal_at_ < button) button = *stop_signal_at_;
  auto end = button + options_.preemption_window - options_.final_sync_margin;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - now);
  if (left >= budget) return {budget, false};
  return {std::max(left, std::chrono::milliseconds(0)), true};
}

std::optional<SteadyTime> StateMachine::WindowEnd(SteadyTime now) const {
  if (!preempted_) return std::nullopt;
  auto button = power_button_at_.value_or(now);
  if (stop_signal_at_ && *stop_signal_at_ < button) button = *stop_signal_at_;
  return button + options_.preemption_window;
}

std::optional<SteadyTime> StateMachine::RecordsDeadline(SteadyTime now) const {
  auto end = WindowEnd(now);
  if (!end) return std::nullopt;
  return *end - options_.final_sync_margin / 2;
}

std::optional<SteadyTime> StateMachine::DeadlineFor(State s, SteadyTime now) const {
  auto earliest = [](std::optional<SteadyTime> a, std::optional<SteadyTime> b) -> std::optional<SteadyTime> {
    if (!a) return b;
    if (!b) return a;
    return std::min(*a, *b);
  };
  switch (s) {
    case State::kStarting:
    case State::kDone: return std::nullopt;
    case State::kMounting: return now + options_.mount_timeout;
    case State::kMountsCancelled:
    case State::kRestoreCancelled: return now + kCancelGrace;
    case State::kRestoring: return now + options_.restore_timeout;
    case State::kForming: return now + (reforming_ ? options_.gang_reform_timeout : options_.gang_form_timeout);
    case State::kGangLossCheck: return now + options_.gang_loss_grace;
    case State::kGangWaiting: return now + options_.gang_form_timeout;
    case State::kRunning: return earliest(max_runtime_at_, scheduled_stop_at_);
    case State::kStoppingInt: return now + options_.stop_timeout;
    case State::kStoppingTerm: return now + options_.kill_timeout;
    case State::kStoppingKill: return now + options_.kill_grace;
    case State::kDrainingTerm: return now + options_.kill_timeout;
    case State::kDrainingKill: return now + options_.kill_grace;
    case State::kRestartingSyncDelay:
    case State::kRestartingDelay: return earliest(restart_at_, max_runtime_at_);
    case State::kRestartingSync: return earliest(now + options_.final_sync_timeout, max_runtime_at_);
    case State::kSyncing: return final_sync_end_;
    case State::kSyncCancelled: return std::min(final_sync_end_, now + kCancelGrace);
    case State::kHolding: return now + options_.on_failure_hold;
    case State::kUnmounting: return now + options_.unmount_timeout;
    case State::kFinishing: return now + options_.on_exit_timeout / 2;
    case State::kPoweringOff: {
      // An equal share of what is left for each attempt still to come; the
      // last second is kept for the forced power-off.
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(on_exit_deadline_ - now) - std::chrono::seconds(1);
      int remaining = std::max(1, options_.poweroff_attempts - poweroff_attempts_ + 1);
      return now + std::max(left, std::chrono::milliseconds(0)) / remaining;
    }
  }
  return std::nullopt;
}

// What each state waits for at most, for the docs.
static const char* DeadlineDoc(State s) {
  switch (s) {
    case State::kStarting: return "none";
    case State::kMounting: return "`mount-timeout` × 3 + 10 min (the whole mounting step)";
    case State::kMountsCancelled: return "10 s";
    case State::kRestoring: return "30 min";
    case State::kRestoreCancelled: return "10 s";
    case State::kForming: return "`gang-form-timeout`; forming again after a loss: `gang-reform-timeout`";
    case State::kRunning: return "`max-runtime` (from spotvisor's start), or the stop time of a notice with a lead; else none";
    case State::kStoppingInt: return "`stop-timeout`";
    case State::kStoppingTerm: return "`kill-timeout`";
    case State::kStoppingKill: return "5 s";
    case State::kDrainingTerm: return "`kill-timeout`";
    case State::kDrainingKill: return "5 s";
    case State::kGangLossCheck: return "`gang-lease-ttl` + max(5 s, half of it)";
    case State::kGangWaiting: return "`gang-form-timeout`";
    case State::kRestartingSyncDelay:
    case State::kRestartingDelay: return "`restart-delay` (doubled per quick crash, ≤ 5 min), or `max-runtime` if sooner";
    case State::kRestartingSync: return "10 min (a restart does not wait longer for its sync), or `max-runtime` if sooner";
    case State::kSyncing: return "10 min; after a preemption, what is left of `preemption-window` less 3 s";
    case State::kSyncCancelled: return "10 s, within the sync's own deadline";
    case State::kHolding: return "`on-failure-hold`";
    case State::kUnmounting: return "90 s";
    case State::kFinishing: return "half of `on-exit-timeout`";
    case State::kPoweringOff: return "an equal share of what is left of `on-exit-timeout` per attempt still to come, less 1 s";
    case State::kDone: return "—";
  }
  return "?";
}

std::string StateMachine::TableMarkdown() {
  std::string md = "| state | phase | deadline |\n| --- | --- | --- |\n";
  for (int i = 0; i < kStateCount; ++i) {
    auto s = static_cast<State>(i);
    md += fmt::format("| `{}` | `{}` | {} |\n", StateName(s), PhaseName(PhaseOf(s)), DeadlineDoc(s));
  }
  auto states = [](StateSet set) {
    if (set == kAnyState) return std::string("any");
    std::string text;
    for (int i = 0; i < kStateCount; ++i) {
      auto s = static_cast<State>(i);
      if (!(set & Bit(s))) continue;
      // A whole phase with sub-states reads as `phase/*`.
      StateSet phase_set = 0;
      for (int j = 0; j < kStateCount; ++j) {
        if (PhaseOf(static_cast<State>(j)) == PhaseOf(s)) phase_set |= Bit(static_cast<State>(j));
      }
      bool whole = (set & phase_set) == phase_set && phase_set != Bit(s);
      std::string name = whole ? std::string(PhaseName(PhaseOf(s))) + "/*" : StateName(s);
      if (whole) {
        bool first = true;
        for (int j = 0; j < i; ++j) {
          if (PhaseOf(static_cast<State>(j)) == PhaseOf(s)) first = false;
        }
        if (!first) continue;
      }
      text += (text.empty() ? "" : ", ") + fmt::format("`{}`", name);
    }
    return text;
  };
  md += "\n| in | on | what happens |\n| --- | --- | --- |\n";
  for (auto const& row : Table()) {
    md += fmt::format("| {} | `{}` | {} |\n", states(row.states), kEventNames[row.event], row.does);
  }
  return md;
}

// ---------------------------------------------------------------- handlers

void StateMachine::OnStart(const StartEvent& e, SteadyTime now, std::vector<Action>& out) {
  started_ = now;
  if (options_.max_runtime.count() > 0) max_runtime_at_ = now + options_.max_runtime;
  if (e.already_preempted || e.maintenance_terminate) {
    preempted_ = e.already_preempted;
    reason_ = e.already_preempted ? EndReason::kPreempted : EndReason::kMaintenance;
    exit_code_ = kExitPreemptedBeforeStart;
    Log(Severity::kWarning, e.already_preempted ? "preemption.detected" : "maintenance.detected",
        e.already_preempted ? "instance/preempted is already TRUE: not starting the trainer"
                            : "maintenance-event is TERMINATE_ON_HOST_MAINTENANCE: not starting the trainer",
        {{"when", "startup"}});
    Finish(now, out);
    return;
  }
  if (options_.mounts) {
    mounts_active_ = true;
    out.push_back(StartMounts{});
    Transition(State::kMounting, now, "mounting disks and the bucket");
    return;
  }
  AfterMounts(now, out);
}

void StateMachine::OnMountsDone(const MountsDone& e, SteadyTime now, std::vector<Action>& out) {
  if (!e.ok && state_ == State::kMounting) {
    Log(Severity::kError, "mount.failed", "mounting failed; not starting the trainer: " + e.error, {{"error", e.error}});
    if (!reason_) {  // a preemption or stop signal meanwhile says more
      reason_ = EndReason::kMountFailed;
      exit_code_ = kExitMountFailed;
    }
  }
  if (reason_) {  // failed, or preempted / stopped while mounting
    if (*reason_ == EndReason::kPreempted || *reason_ == EndReason::kMaintenance) exit_code_ = kExitPreemptedBeforeStart;
    Finish(now, out);
    return;
  }
  AfterMounts(now, out);
}

void StateMachine::OnRestoreDone(const RestoreDone& e, SteadyTime now, std::vector<Action>& out) {
  if (reason_) {  // preempted or stopped while restoring
    if (*reason_ != EndReason::kStopped) exit_code_ = kExitPreemptedBeforeStart;
    Finish(now, out);
    return;
  }
  if (!e.ok) {
    // Never start from scratch: the first sync would replace a newer
    // checkpoint with an older one.
    reason_ = EndReason::kRestoreFailed;
    exit_code_ = kExitRestoreFailed;
    Log(Severity::kError, "restore.failed", "restore failed; not starting the trainer from scratch: " + e.error, {{"error", e.error}});
    Finish(now, out);
    return;
  }
  if (e.already_done) {
    reason_ = EndReason::kAlreadyDone;
    exit_code_ = 0;
    Finish(now, out);
    return;
  }
  if (e.run_failed) {
    reason_ = EndReason::kRunFailed;
    exit_code_ = kExitRunFailed;
    Finish(now, out);
    return;
  }
  if (e.run_stopped) {
    reason_ = EndReason::kStopRequested;
    exit_code_ = 0;
    Finish(now, out);
    return;
  }
  FormOrSpawn(e.resumed, now, out);
}

void StateMachine::FormOrSpawn(bool resumed, SteadyTime now, std::vector<Action>& out) {
  if (!options_.gang || gang_formed_) {  // no gang, or restored after forming again
    out.push_back(SpawnTrainer{resumed, restarts_});
    return;
  }
  restore_resumed_ = resumed;
  out.push_back(StartForming{});
  Transition(State::kForming, now, "waiting for every member of the gang");
}

void StateMachine::StopForming(EndReason reason, int exit_code, SteadyTime now, std::vector<Action>& out) {
  reason_ = reason;
  exit_code_ = exit_code;
  out.push_back(CancelForming{});
  Finish(now, out);
}

void StateMachine::EndGangFor(EndReason reason, std::vector<Action>& out) {
  if (!options_.gang || !gang_formed_ || gang_ended_) return;
  gang_ended_ = true;
  std::string why;
  switch (reason) {
    case EndReason::kPreempted: why = preemption_what_.empty() ? "preempted" : "interrupted (" + preemption_what_ + ")"; break;
    case EndReason::kMaintenance: why = "a host maintenance will terminate it"; break;
    case EndReason::kStopped: why = "stopped by a signal"; break;
    case EndReason::kFailed: why = fmt::format("trainer failed (exit code {})", exit_code_); break;
    case EndReason::kMaxRuntime: why = "max-runtime reached"; break;
    case EndReason::kIdle: why = "trainer idle for idle-timeout"; break;
    case EndReason::kSyncStalled: why = "checkpoints could not be made durable (sync-stall-action = stop)"; break;
    default: why = fmt::format("run ended ({})", EndReasonName(reason)); break;
  }
  out.push_back(EndGang{why, reason == EndReason::kFailed});
}

void StateMachine::OnGangEnded(const GangEnded& e, SteadyTime now, std::vector<Action>& out) {
  if (!gang_formed_) return;
  // Completed while this member's trainer runs: only with gang-launch =
  // leader, where rank 0's command is the work and the others' stand-ins
  // end with it. Any other end stops the trainer for the gang's sake.
  BeginStop(e.completed ? EndReason::kCompleted : EndReason::kGangEnded, now, out);
}

bool StateMachine::AwaitGang(SteadyTime now, std::vector<Action>& out) {
  if (!options_.gang || !gang_formed_ || reason_ != EndReason::kCompleted) return false;
  if (gang_ended_) {
    AfterGang(now, out);
    return true;
  }
  out.push_back(GangDone{});
  gang_waited_ = std::chrono::milliseconds(0);
  Transition(State::kGangWaiting, now, "the trainer finished: waiting for the other members' trainers to finish");
  return true;
}

void StateMachine::AfterGang(SteadyTime now, std::vector<Action>& out) {
  bool clean = reason_ == EndReason::kCompleted && gang_completed_;
  if (reason_ == EndReason::kCompleted && !clean) reason_ = EndReason::kGangEnded;
  if (!Syncs()) {
    Finish(now, out);
    return;
  }
  BeginFinalSync(clean, now,
                 clean ? "the whole gang finished: final sync, then the DONE marker" : "final sync of the trainer's last checkpoint",
                 out);
}

void StateMachine::OnSpawned(const TrainerSpawned& e, SteadyTime now) {
  trainer_pid_ = e.pid;
  trainer_signal_ = 0;
  trainer_started_ = now;
  trainer_ran_ = true;
  leader_exited_ = false;
  if (window_stop_at_ && (!scheduled_stop_at_ || *window_stop_at_ < *scheduled_stop_at_)) {
    scheduled_stop_at_ = window_stop_at_;
    scheduled_reason_ = EndReason::kMaintenance;
    scheduled_by_window_ = true;
  }
  Transition(State::kRunning, now, fmt::format("trainer started as pid {}", e.pid));
}

void StateMachine::NotePreemption(const PreemptionNotice& e, SteadyTime now) {
  preempted_ = true;
  if (!e.what.empty()) preemption_what_ = e.what;
  bool lead = state_ == State::kRunning && options_.preemption_stop_lead.count() > 0;
  // With a preemption notice the power button comes that much later (without
  // a known notice, a stop lead implies one at least as long); a SIGTERM seen
  // first was the button itself. A notice that says when the machine is
  // taken (EC2) puts the end of the window there.
  auto notice = options_.preemption_notice.count() > 0 ? options_.preemption_notice : options_.preemption_stop_lead;
  auto button = now + notice;
  if (e.ends_at) {
    // The window ends at the notice's time, however late the notice was
    // seen (a late poll, a restart, an IMDS outage): the button is that
    // time less the window, which may be in the past. Clamping it to now
    // gave a notice seen with 20 s left a final sync ending 7 s after the
    // machine was taken.
    button = *e.ends_at - options_.preemption_window;
    notice = std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(button - now));
  }
  if (!power_button_at_ || button < *power_button_at_) power_button_at_ = button;
  std::string when = notice.count() > 0 ? fmt::format(" (the power button comes in {})", FormatDuration(notice)) : "";
  nlohmann::json f = {{"phase", PhaseName(phase())}};
  if (notice.count() > 0) f["notice_s"] = std::chrono::duration<double>(notice).count();
  std::string what = e.what.empty() ? "instance/preempted is TRUE" : e.what;
  if (e.ends_at) {
    when = fmt::format(" (the machine is taken in {}; the final sync must be committed before)",
                       FormatDuration(std::chrono::duration_cast<std::chrono::milliseconds>(*e.ends_at - now)));
    f["ends_in_s"] = std::chrono::duration<double>(*e.ends_at - now).count();
  }
  Log(Severity::kWarning, "preemption.detected",
      lead ? fmt::format("{}{}: syncing now, stopping the trainer in {} (preemption-stop-lead)", what, when,
                         FormatDuration(options_.preemption_stop_lead))
           : fmt::format("{}: the VM is being preempted{}", what, when),
      std::move(f));
}

void StateMachine::NoteStopSignal(const StopSignal& e, SteadyTime now) {
  // on-exit is for the end of the work, not for a system that is already
  // going down (likely the reason for the signal).
  ++stop_signals_;
  signalled_ = true;
  // Only a preemption turns this into the power button (see FinalSyncBudget).
  if (!stop_signal_at_) stop_signal_at_ = now;
  Log(Severity::kWarning, "signal.received", fmt::format("spotvisor received {}", SignalName(e.signo)),
      {{"signal", SignalName(e.signo)}, {"phase", PhaseName(phase())}});
}

void StateMachine::OnMaintenanceWindow(const MaintenanceWindow& e, SteadyTime now, std::vector<Action>& out) {
  if (scheduled_by_window_) {
    scheduled_stop_at_.reset();
    scheduled_by_window_ = false;
    deadline_ = DeadlineFor(State::kRunning, now);
  }
  if (!e.stop_at) return;
  if (*e.stop_at <= now) {
    BeginStop(EndReason::kMaintenance, now, out);
    return;
  }
  auto before = scheduled_stop_at_;
  ScheduleStop(EndReason::kMaintenance, std::chrono::duration_cast<std::chrono::milliseconds>(*e.stop_at - now), now, out);
  scheduled_by_window_ = scheduled_stop_at_ != before;
}

void StateMachine::OnMaintenanceRunning(SteadyTime now, std::vector<Action>& out) {
  if (options_.maintenance_stop_lead.count() == 0 && window_stop_at_ && *window_stop_at_ > now) {
    // upcoming-maintenance said when the window opens: train until
    // maintenance-stop-before it instead of stopping an hour early.
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*window_stop_at_ - now);
    Log(Severity::kWarning, "maintenance.detected",
        fmt::format("host maintenance will terminate this VM: stopping the trainer in {}, before the window "
                    "upcoming-maintenance gave", FormatDuration(left)),
        {{"value", "TERMINATE_ON_HOST_MAINTENANCE"}, {"stop_in_s", std::chrono::duration<double>(left).count()}});
    auto before = scheduled_stop_at_;
    ScheduleStop(EndReason::kMaintenance, left, now, out);
    if (scheduled_stop_at_ != before) scheduled_by_window_ = true;
    return;
  }
  bool scheduled = options_.maintenance_stop_lead.count() > 0;
  Log(Severity::kWarning, "maintenance.detected",
      scheduled ? fmt::format("host maintenance will terminate this VM: syncing now, stopping the trainer in {}",
                              FormatDuration(options_.maintenance_stop_lead))
                : std::string("host maintenance will terminate this VM: stopping the trainer"),
      {{"value", "TERMINATE_ON_HOST_MAINTENANCE"}});
  if (scheduled) {
    ScheduleStop(EndReason::kMaintenance, options_.maintenance_stop_lead, now, out);
  } else {
    BeginStop(EndReason::kMaintenance, now, out);
  }
}

void StateMachine::OnOnExitDone(const OnExitDone& e, SteadyTime now, std::vector<Action>& out) {
  Log(e.exit_code == 0 ? Severity::kInfo : Severity::kError, "shutdown.done",
      e.exit_code == 0 ? "on-exit finished" : fmt::format("on-exit failed (exit code {})", e.exit_code), {{"exit_code", e.exit_code}});
  if (e.exit_code != 0) {
    // Never leave the VM running by accident.
    PowerOff(now, "on-exit failed", out);
    return;
  }
  Transition(State::kDone, now, "on-exit done");
  out.push_back(ExitProcess{exit_code_});
}

void StateMachine::OnRunningDeadline(SteadyTime now, std::vector<Action>& out) {
  if (scheduled_stop_at_ && now >= *scheduled_stop_at_) {
    BeginStop(scheduled_reason_, now, out);
  } else if (max_runtime_at_ && now >= *max_runtime_at_) {
    Log(Severity::kWarning, "run.max_runtime",
        fmt::format("max-runtime {} reached: stopping the trainer", FormatDuration(options_.max_runtime)));
    BeginStop(EndReason::kMaxRuntime, now, out);
  }
}

void StateMachine::OnRestartDeadline(SteadyTime now, std::vector<Action>& out) {
  if (max_runtime_at_ && now >= *max_runtime_at_) {
    Log(Severity::kWarning, "run.max_runtime", "max-runtime reached while waiting to restart: not restarting");
    StopFromIdle(EndReason::kMaxRuntime, now, out);
    return;
  }
  if (state_ == State::kRestartingSyncDelay) {
    Transition(State::kRestartingSync, now, "restart-delay is over; waiting for the restart's sync");
    return;
  }
  if (state_ == State::kRestartingSync) {
    Log(Severity::kWarning, "restart.sync_timeout",
        fmt::format("the restart's sync did not finish within {}: restarting the trainer without it",
                    FormatDuration(options_.final_sync_timeout)));
  }
  RestartNow(now, out);
}

// A gang restarts together: the failed trainer's generation has ended, so
// this member forms again with the others (who wait: gang-on-loss = wait).
void StateMachine::RestartNow(SteadyTime now, std::vector<Action>& out) {
  if (options_.gang) {
    Reform(now, out, fmt::format("restart {} of {}: forming the gang again", restarts_, options_.max_restarts));
    return;
  }
  out.push_back(SpawnTrainer{/*resumed=*/true, restarts_});
}

void StateMachine::BeginStop(EndReason reason, SteadyTime now, std::vector<Action>& out) {
  reason_ = reason;
  stop_signal_ = SIGINT;
  Log(Severity::kWarning, "trainer.signal", fmt::format("sending SIGINT to the trainer's process group {}", trainer_pid_),
      {{"signal", "SIGINT"}, {"pgid", trainer_pid_}, {"reason", EndReasonName(reason)}});
  out.push_back(SignalTrainer{SIGINT});
  EndGangFor(reason, out);
  Transition(State::kStoppingInt, now,
             fmt::format("{}: waiting up to {} for the trainer to stop", EndReasonName(reason), FormatDuration(options_.stop_timeout)));
}

void StateMachine::Escalate(SteadyTime now, std::vector<Action>& out, const std::string& why) {
  if (state_ == State::kStoppingKill) {
    Log(Severity::kError, "trainer.unkillable",
        fmt::format("trainer process group {} did not exit after SIGKILL (stuck in the kernel?); finishing anyway", trainer_pid_));
    if (!leader_exited_) {
      exit_code_ = 128 + SIGKILL;
      trainer_signal_ = SIGKILL;
    }
    Finish(now, out);
    return;
  }
  int next = state_ == State::kStoppingInt ? SIGTERM : SIGKILL;
  stop_signal_ = next;
  Log(Severity::kWarning, "trainer.signal",
      fmt::format("{}: sending {} to the trainer's process group {}", why, SignalName(next), trainer_pid_),
      {{"signal", SignalName(next)}, {"pgid", trainer_pid_}, {"reason", why}});
  out.push_back(SignalTrainer{next});
  Transition(next == SIGTERM ? State::kStoppingTerm : State::kStoppingKill, now, fmt::format("sent {}", SignalName(next)));
}

void StateMachine::OnTrainerExited(const TrainerExited& e, SteadyTime now, std::vector<Action>& out) {
  if (e.pid != trainer_pid_ || leader_exited_) return;
  leader_exited_ = true;
  exit_code_ = e.signal != 0 ? 128 + e.signal : e.exit_code;
  trainer_signal_ = e.signal;
  nlohmann::json f = {{"pid", e.pid}, {"exit_code", exit_code_}, {"runtime_s", Seconds(now - trainer_started_)}};
  if (e.signal != 0) f["signal"] = SignalName(e.signal);
  if (e.group_remaining > 0) f["group_remaining"] = e.group_remaining;
  std::string how = e.signal != 0 ? fmt::format("killed by {}", SignalName(e.signal)) : fmt::format("exited with code {}", e.exit_code);
  bool ok = exit_code_ == 0 || phase() == Phase::kStopping;
  Log(ok ? Severity::kInfo : Severity::kError, "trainer.exit", fmt::format("trainer {}", how), f);
  if (!reason_) reason_ = exit_code_ == 0 ? EndReason::kCompleted : EndReason::kFailed;
  // In a gang the failure may be a lost peer's (AwaitLoss): the generation
  // is ended for it only once that is decided.
  if (*reason_ == EndReason::kFailed && !MayBeGangLoss()) EndGangFor(EndReason::kFailed, out);
  // Stopped because its progress could not be made durable: not a success,
  // whatever the trainer answered to SIGINT.
  if (reason_ == EndReason::kSyncStalled && exit_code_ == 0) exit_code_ = kExitSyncFailed;
  if (phase() == Phase::kStopping && e.group_remaining > 0) {
    // The ladder goes on for the whole group: the process that got our
    // SIGINT and is saving a checkpoint may be a child of the one that died.
    Log(Severity::kInfo, "trainer.group_wait",
        fmt::format("{} process(es) remain in the trainer's group: the stop ladder continues for them", e.group_remaining),
        {{"remaining", e.group_remaining}});
    return;
  }
  BeginDraining(now, out);
}

void StateMachine::BeginDraining(SteadyTime now, std::vector<Action>& out) {
  out.push_back(SignalLeftovers{SIGTERM});
  Transition(State::kDrainingTerm, now, "trainer exited: stopping anything it left running");
}

// Notice, not an emergency: save now, stop between steps later. A second
// notice keeps the earlier stop time.
void StateMachine::ScheduleStop(EndReason reason, std::chrono::milliseconds lead, SteadyTime now, std::vector<Action>& out) {
  auto at = now + lead;
  if (scheduled_stop_at_ && *scheduled_stop_at_ <= at) return;
  bool first = !scheduled_stop_at_;
  scheduled_stop_at_ = at;
  scheduled_reason_ = reason;
  if (first && Syncs()) out.push_back(SyncNow{reason == EndReason::kPreempted ? "preemption" : "maintenance"});
  deadline_ = DeadlineFor(State::kRunning, now);  // the stop time is the running state's deadline now
}

// The trainer is not running (between restarts): no ladder, straight to the
// final sync and on-exit.
void StateMachine::LogStopRequested(const StopRequested& e) {
  Log(Severity::kNotice, "run.stop_requested",
      fmt::format("a stop was requested ({}): stopping the trainer gracefully; the final sync, then on-exit",
                  e.by.empty() ? std::string("RUN_ID/STOP") : e.by),
      {{"by", e.by}});
}

void StateMachine::StopFromIdle(EndReason reason, SteadyTime now, std::vector<Action>& out) {
  reason_ = reason;
  if (!Syncs()) {
    Finish(now, out);
    return;
  }
  BeginFinalSync(false, now, "final sync of the trainer's last checkpoint", out);
}

// s6-style: restarts are counted, and a trainer that crashes soon after it
// started waits twice as long each time, so a crash loop cannot spin.
bool StateMachine::MaybeRestart(SteadyTime now, std::vector<Action>& out) {
  if (*reason_ != EndReason::kFailed || !options_.restart_on_failure) return false;
  if (signalled_ || preempted_) {
    Log(Severity::kInfo, "restart.skipped",
        signalled_ ? "the trainer failed, but spotvisor is being stopped: not restarting it"
                   : "the trainer failed, but the VM is being preempted: not restarting it");
    return false;
  }
  if (restarts_ >= options_.max_restarts) {
    Log(Severity::kError, "restart.exhausted",
        fmt::format("trainer failed again after {} restart(s): max-restarts reached, the run ends as failed", restarts_),
        {{"restarts", restarts_}, {"exit_code", exit_code_}});
    return false;
  }
  bool quick = now - trainer_started_ < options_.quick_crash;
  quick_streak_ = quick ? quick_streak_ + 1 : 0;
  if (quick_streak_ >= options_.max_quick_crashes) {
    Log(Severity::kError, "restart.exhausted",
        fmt::format("trainer crashed within {} of starting {} times in a row: a crash loop, not restarting it again",
                    FormatDuration(options_.quick_crash), quick_streak_),
        {{"restarts", restarts_}, {"exit_code", exit_code_}, {"quick_crashes", quick_streak_}});
    return false;
  }
  auto delay = options_.restart_delay;
  for (int i = 1; i < quick_streak_ && delay < options_.restart_delay_max; ++i) delay *= 2;
  delay = std::min(delay, options_.restart_delay_max);
  ++restarts_;
  Log(Severity::kWarning, "restart.scheduled",
      fmt::format("trainer failed (exit code {}): restart {} of {} in {}", exit_code_, restarts_, options_.max_restarts,
                  FormatDuration(delay)),
      {{"restart", restarts_}, {"max_restarts", options_.max_restarts}, {"delay_s", std::chrono::duration<double>(delay).count()},
       {"exit_code", exit_code_}, {"quick_crashes", quick_streak_}});
  reason_.reset();
  restart_at_ = now + delay;
  if (Syncs()) out.push_back(SyncNow{"restart"});
  Transition(Syncs() ? State::kRestartingSyncDelay : State::kRestartingDelay, now,
             Syncs() ? "syncing, then restarting" : "waiting to restart");
  return true;
}

// Issue #28: in a gang, a trainer that failed may have failed because a
// peer is gone (its collective broke at once; the peer's lease expires only
// later). Until the gang has spoken (an end it already heard, or one within
// gang_loss_grace), the failure is not this member's.
bool StateMachine::MayBeGangLoss() const {
  return options_.gang && gang_formed_ && !gang_ended_ && reason_ == EndReason::kFailed && !preempted_ && !signalled_;
}

bool StateMachine::AwaitLoss(SteadyTime now, std::vector<Action>& out) {
  if (!options_.gang || !gang_formed_ || reason_ != EndReason::kFailed) return false;
  if (gang_ended_ || preempted_ || signalled_) {
    AfterLossCheck(now, out);  // heard (or going) while the trainer was draining: judged at once
    return true;
  }
  Transition(State::kGangLossCheck, now,
             fmt::format("the trainer failed: waiting up to {} for the gang to say whether a member was lost first",
                         FormatDuration(options_.gang_loss_grace)));
  return true;
}

void StateMachine::AfterLossCheck(SteadyTime now, std::vector<Action>& out) {
  if (gang_ended_ && !gang_end_failed_ && !gang_completed_ && reason_ == EndReason::kFailed) {
    reason_ = EndReason::kGangEnded;
    Log(Severity::kWarning, "gang.loss_taken",
        fmt::format("the trainer failed (exit code {}) with the gang: another member was lost, so this is the "
                    "gang's loss, not this member's failure{}",
                    exit_code_, options_.gang_wait && !preempted_ && !signalled_ ? " (gang-on-loss = wait: forming again)" : ""),
        {{"exit_code", exit_code_}});
  }
  if (reason_ == EndReason::kFailed) EndGangFor(EndReason::kFailed, out);  // this member's own: the others stop
  Conclude(now, out);
}

void StateMachine::AfterDraining(SteadyTime now, std::vector<Action>& out) {
  if (AwaitLoss(now, out)) return;
  Conclude(now, out);
}

// The trainer is gone and what it was is decided: restart it, wait for the
// gang, or the final sync.
void StateMachine::Conclude(SteadyTime now, std::vector<Action>& out) {
  if (MaybeRestart(now, out)) return;
  if (AwaitGang(now, out)) return;
  if (!Syncs()) {
    Finish(now, out);
    return;
  }
  bool clean = *reason_ == EndReason::kCompleted;
  BeginFinalSync(clean, now, clean ? "final sync, then the DONE marker" : "final sync of the trainer's last checkpoint", out);
}

// Stopped or preempted before the trainer started: nothing there is worth
// waiting for. The mounting phase gets a short deadline to unwind.
void StateMachine::CutShortBeforeTrainer(SteadyTime now, std::vector<Action>& out) {
  if (state_ == State::kRestoring) {
    out.push_back(CancelRestore{});
    Transition(State::kRestoreCancelled, now, "cancelling the restore: the run is ending");
  } else if (state_ == State::kMounting) {
    out.push_back(CancelMounts{});
    Transition(State::kMountsCancelled, now, "cancelling the mounts: the run is ending");
  }
}

void StateMachine::BeginFinalSync(bool write_done, SteadyTime now, const std::string& why, std::vector<Action>& out) {
  auto [budget, urgent] = FinalSyncBudget(now);
  final_sync_end_ = now + budget;
  out.push_back(StartFinalSync{write_done, final_sync_end_, urgent});
  Transition(State::kSyncing, now, urgent ? fmt::format("{} within the Spot window ({} left)", why, FormatDuration(budget)) : why);
}

void StateMachine::Finish(SteadyTime now, std::vector<Action>& out) {
  if (ReformAfterLoss()) {
    Reform(now, out, fmt::format("gang-on-loss = wait: the trainer is stopped{}", Syncs() ? " and its checkpoint synced" : ""));
    return;
  }
  // A generation still in force ends with this member's run (a restore
  // after forming again that failed, say).
  if (reason_) EndGangFor(*reason_, out);
  // The power button's SIGTERM and preempted=TRUE arrive in either order
  // (or preempted=TRUE first with preemption-stop-lead): it is a preemption.
  if (preempted_ && reason_ == EndReason::kStopped) reason_ = EndReason::kPreempted;
  nlohmann::json f = {{"reason", EndReasonName(*reason_)}, {"exit_code", exit_code_},
                      {"duration_s", Seconds(now - started_)}};
  if (trainer_ran_) f["trainer_runtime_s"] = Seconds(now - trainer_started_);
  Severity s = EndSeverity(*reason_);
  Log(s, "run.end", fmt::format("run ended: {} (exit code {})", EndReasonName(*reason_), exit_code_), f);
  // Stopped by a signal means systemd or an operator is already stopping us
  // (the system may be shutting down): powering off on top would surprise an
  // operator who only ran `systemctl stop spotvisor`.
  // A preempted VM is being stopped or deleted by GCE already, as its
  // --instance-termination-action says; on-exit on top could contradict that
  // (delete a VM meant to be restarted).
  if (!options_.run_on_exit || OnExitVetoed() || on_exit_started_) {
    SkipOnExit();
    Teardown(now, out, false);
    return;
  }
  bool failed = *reason_ == EndReason::kFailed || *reason_ == EndReason::kRestoreFailed ||
                *reason_ == EndReason::kMountFailed || *reason_ == EndReason::kSyncFailed;
  if (failed && options_.on_failure_hold.count() > 0) {
    Log(Severity::kWarning, "run.hold",
        fmt::format("the run failed: holding the VM for {} before on-exit, for debugging (end it early with `spotvisor release`)",
                    FormatDuration(options_.on_failure_hold)),
        {{"hold_s", std::chrono::duration<double>(options_.on_failure_hold).count()}});
    Transition(State::kHolding, now, "on-failure-hold");
    return;
  }
  RunOnExitNow(now, out);
}

void StateMachine::RunOnExitNow(SteadyTime now, std::vector<Action>& out) { Teardown(now, out, true); }

bool StateMachine::ReformAfterLoss() const {
  return options_.gang && options_.gang_wait && reason_ == EndReason::kGangEnded && !preempted_ && !signalled_;
}

// gang-on-loss = wait: the trainer is stopped and (rank 0) synced; form again
// with whoever comes back, then restore the gang's newest checkpoint.
void StateMachine::Reform(SteadyTime now, std::vector<Action>& out, const std::string& why) {
  Log(Severity::kWarning, "gang.reforming",
      fmt::format("{}; waiting up to {} for the gang to form again", why, FormatDuration(options_.gang_reform_timeout)),
      {{"reform_timeout_s", std::chrono::duration<double>(options_.gang_reform_timeout).count()}});
  reason_.reset();
  exit_code_ = 0;
  stop_signal_ = 0;
  gang_formed_ = gang_ended_ = gang_completed_ = gang_end_failed_ = false;
  sync_writes_ = true;
  reforming_ = true;
  scheduled_stop_at_.reset();
  // Forming first: the generation needs every member back in `forming`, so
  // rank 0's final sync is over when it forms; then the restore.
  out.push_back(StartForming{});
  Transition(State::kForming, now, "waiting for the gang to form again");
}

void StateMachine::Teardown(SteadyTime now, std::vector<Action>& out, bool then_on_exit) {
  on_exit_after_teardown_ = then_on_exit;
  if (mounts_active_) {
    mounts_active_ = false;
    out.push_back(StartUnmounts{});
    Transition(State::kUnmounting, now, "unmounting, in reverse order");
    return;
  }
  AfterTeardown(now, out);
}

bool StateMachine::OnExitVetoed() const {
  // The VM goes anyway; leaving the group costs one call and spares a boot
  // that would only find DONE.
  if (options_.leave_group_when_done && reason_ == EndReason::kCompleted) return false;
  return signalled_ || preempted_;
}

void StateMachine::SkipOnExit() {
  Log(Severity::kInfo, "shutdown.skipped",
      !options_.run_on_exit ? "on-exit is none: leaving the machine running"
      : signalled_          ? "spotvisor was stopped by a signal: not running on-exit"
      : !preemption_what_.empty()
          ? fmt::format("the instance is being interrupted ({}): EC2 stops, hibernates or terminates it as the notice "
                        "says, so on-exit is not run",
                        preemption_what_)
          : "the VM is being preempted: GCE stops or deletes it (--instance-termination-action), so on-exit is not run");
}

bool StateMachine::Ending() const {
  if (signalled_) return true;
  switch (phase()) {
    case Phase::kStopping:
    case Phase::kUnmounting:
    case Phase::kFinishing:
    case Phase::kPoweringOff:
    case Phase::kDone: return true;
    case Phase::kDraining:
    case Phase::kSyncing: {
      if (!reason_) return false;
      bool failed = *reason_ == EndReason::kFailed;
      // A crash that may be restarted, or a failure that will be held, is not the end yet.
      if (failed && phase() == Phase::kDraining && options_.restart_on_failure && !preempted_) return false;
      if (failed && options_.on_failure_hold.count() > 0 && options_.run_on_exit && !preempted_) return false;
      return true;
    }
    default: return false;
  }
}

void StateMachine::AfterTeardown(SteadyTime now, std::vector<Action>& out) {
  if (on_exit_after_teardown_ && OnExitVetoed()) {
    // A stop signal or a preemption arrived while unmounting or holding.
    SkipOnExit();
    on_exit_after_teardown_ = false;
  }
  if (!on_exit_after_teardown_) {
    Transition(State::kDone, now, "run ended");
    out.push_back(ExitProcess{exit_code_});
    return;
  }
  on_exit_started_ = true;
  on_exit_deadline_ = now + options_.on_exit_timeout;
  // Half the budget for the action itself (an API that never answers must
  // not eat it all): the rest is for powering off.
  Transition(State::kFinishing, now, "running on-exit");
  out.push_back(RunOnExit{});
}

// The on-exit ladder's last rungs: shutdown-command, retried while the
// budget lasts, then reboot(2). Each attempt gets an equal share of what is
// left; the last second is kept for the forced power-off.
void StateMachine::PowerOff(SteadyTime now, const std::string& why, std::vector<Action>& out) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(on_exit_deadline_ - now) - std::chrono::seconds(1);
  int remaining = options_.poweroff_attempts - poweroff_attempts_;
  if (remaining <= 0 || left.count() <= 0) {
    Log(Severity::kCritical, "shutdown.forced",
        fmt::format("{}, and shutdown-command did not power the VM off ({} attempt(s)): powering off by force",
                    why, poweroff_attempts_),
        {{"attempts", poweroff_attempts_}});
    out.push_back(ForcePoweroff{});
    Transition(State::kDone, now, "powered off by force");
    out.push_back(ExitProcess{exit_code_});
    return;
  }
  ++poweroff_attempts_;
  Log(Severity::kError, "shutdown.poweroff",
      fmt::format("{}: powering off with shutdown-command (attempt {} of {})", why, poweroff_attempts_, options_.poweroff_attempts),
      {{"attempt", poweroff_attempts_}});
  out.push_back(RunPoweroff{poweroff_attempts_});
  Transition(State::kPoweringOff, now, fmt::format("shutdown-command, attempt {}", poweroff_attempts_));
}

void StateMachine::AfterMounts(SteadyTime now, std::vector<Action>& out) {
  if (options_.sync && !(options_.gang && options_.gang_restore_after_forming)) {
    out.push_back(StartRestore{});
    Transition(State::kRestoring, now, "restoring the newest complete checkpoint");
    return;
  }
  FormOrSpawn(false, now, out);
}

}  // namespace spotvisor
