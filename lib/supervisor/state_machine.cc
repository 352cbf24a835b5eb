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
    case Phase::kRunning: return "running";
    case Phase::kStopping: return "stopping";
    case Phase::kDraining: return "draining";
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
  }
  return "?";
}

void StateMachine::Log(Severity s, const char* event, std::string message, nlohmann::json fields) {
  if (emit_) emit_(LogEvent{s, event, std::move(message), std::move(fields)});
}

void StateMachine::EnterPhase(Phase p, SteadyTime now, std::optional<std::chrono::milliseconds> deadline,
                              const std::string& why) {
  Phase from = phase_;
  phase_ = p;
  deadline_ = deadline ? std::optional<SteadyTime>(now + *deadline) : std::nullopt;
  nlohmann::json f = {{"from", PhaseName(from)}, {"to", PhaseName(p)}, {"why", why}};
  if (deadline) f["deadline_s"] = std::chrono::duration<double>(*deadline).count();
  Log(Severity::kInfo, "supervisor.state", fmt::format("{} -> {}: {}", PhaseName(from), PhaseName(p), why), f);
}

std::vector<Action> StateMachine::Handle(const Event& event, SteadyTime now) {
  std::vector<Action> out;
  if (phase_ == Phase::kDone) return out;
  std::visit(
      Overloaded{
          [&](const StartEvent& e) {
            if (phase_ != Phase::kStarting) return;
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
              EnterPhase(Phase::kMounting, now, options_.mount_timeout, "mounting disks and the bucket");
              return;
            }
            AfterMounts(now, out);
          },
          [&](const MountsDone& e) {
            if (phase_ != Phase::kMounting) return;
            if (!e.ok && !mount_cancelled_) {
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
          },
          [&](const UnmountsDone& e) {
            if (phase_ != Phase::kUnmounting) return;
            if (!e.problems.empty()) {
              Log(Severity::kError, "mount.unmount_problems",
                  fmt::format("{} mount(s) did not come off cleanly", e.problems.size()), {{"problems", e.problems}});
            }
            AfterTeardown(now, out);
          },
          [&](const RestoreDone& e) {
            if (phase_ != Phase::kRestoring) return;
            if (reason_) {  // preempted or stopped while restoring
              if (*reason_ != EndReason::kStopped) exit_code_ = kExitPreemptedBeforeStart;
              Finish(now, out);
              return;
            }
            if (!e.ok) {
              // Never start from scratch: the first sync would replace a
              // newer checkpoint with an older one.
              reason_ = EndReason::kRestoreFailed;
              exit_code_ = kExitRestoreFailed;
              Log(Severity::kError, "restore.failed", "restore failed; not starting the trainer from scratch: " + e.error,
                  {{"error", e.error}});
              Finish(now, out);
              return;
            }
            if (e.already_done) {
              reason_ = EndReason::kAlreadyDone;
              exit_code_ = 0;
              Finish(now, out);
              return;
            }
            out.push_back(SpawnTrainer{e.resumed});
          },
          [&](const TrainerSpawned& e) {
            if (phase_ != Phase::kStarting && phase_ != Phase::kMounting && phase_ != Phase::kRestoring && phase_ != Phase::kRestarting) return;
            trainer_pid_ = e.pid;
            trainer_started_ = now;
            trainer_ran_ = true;
            leader_exited_ = false;
            EnterPhase(Phase::kRunning, now, std::nullopt, fmt::format("trainer started as pid {}", e.pid));
            deadline_ = RunningDeadline();
          },
          [&](const TrainerSpawnFailed& e) {
            if (phase_ != Phase::kStarting && phase_ != Phase::kMounting && phase_ != Phase::kRestoring && phase_ != Phase::kRestarting) return;
            reason_ = EndReason::kFailed;
            exit_code_ = e.exit_code;
            Log(Severity::kError, "trainer.start_failed", e.error, {{"exit_code", e.exit_code}});
            Finish(now, out);
          },
          [&](const TrainerExited& e) { OnTrainerExited(e, now, out); },
          [&](const GroupEmpty&) {
            if (phase_ == Phase::kStopping && leader_exited_) BeginDraining(now, out);
          },
          [&](const PreemptionNotice&) {
            preempted_ = true;
            bool lead = phase_ == Phase::kRunning && options_.preemption_stop_lead.count() > 0;
            // With a preemption notice the power button comes `lead` later;
            // a SIGTERM seen first was the button itself.
            auto button = now + (options_.preemption_stop_lead.count() > 0 ? options_.preemption_stop_lead
                                                                             : std::chrono::milliseconds(0));
            if (!power_button_at_ || button < *power_button_at_) power_button_at_ = button;
            Log(Severity::kWarning, "preemption.detected",
                lead ? fmt::format("instance/preempted is TRUE: syncing now, stopping the trainer in {} (preemption-stop-lead)",
                                   FormatDuration(options_.preemption_stop_lead))
                     : std::string("instance/preempted is TRUE: the VM is being preempted"),
                {{"phase", PhaseName(phase_)}});
            if (lead) {
              ScheduleStop(EndReason::kPreempted, options_.preemption_stop_lead, now, out);
            } else if (phase_ == Phase::kRunning) {
              BeginStop(EndReason::kPreempted, now, out);
            } else if (reason_ == EndReason::kStopped && (phase_ == Phase::kStopping || phase_ == Phase::kDraining)) {
              // The power button's SIGTERM won the race with the metadata
              // watcher: it is still a preemption.
              reason_ = EndReason::kPreempted;
            }
            if ((phase_ == Phase::kRestoring || phase_ == Phase::kMounting) && !reason_) {
              reason_ = EndReason::kPreempted;
              CutShortBeforeTrainer(now, out);
            }
            if (phase_ == Phase::kRestarting) StopFromIdle(EndReason::kPreempted, now, out);
          },
          [&](const MaintenanceNotice& e) {
            if (e.value == "TERMINATE_ON_HOST_MAINTENANCE") {
              bool scheduled = phase_ == Phase::kRunning && options_.maintenance_stop_lead.count() > 0;
              Log(Severity::kWarning, "maintenance.detected",
                  scheduled ? fmt::format("host maintenance will terminate this VM: syncing now, stopping the trainer in {}",
                                          FormatDuration(options_.maintenance_stop_lead))
                            : std::string("host maintenance will terminate this VM: stopping the trainer"),
                  {{"value", e.value}});
              if (scheduled) {
                ScheduleStop(EndReason::kMaintenance, options_.maintenance_stop_lead, now, out);
              } else if (phase_ == Phase::kRunning) {
                BeginStop(EndReason::kMaintenance, now, out);
              }
              if (phase_ == Phase::kRestarting) StopFromIdle(EndReason::kMaintenance, now, out);
              if ((phase_ == Phase::kRestoring || phase_ == Phase::kMounting) && !reason_) reason_ = EndReason::kMaintenance;
            } else {
              // Live migration pauses the VM briefly; the trainer carries on.
              Log(Severity::kInfo, "maintenance.event", fmt::format("maintenance-event is {}", e.value),
                  {{"value", e.value}});
            }
          },
          [&](const StopSignal& e) {
            // on-exit is for the end of the work, not for a system that is
            // already going down (likely the reason for the signal).
            bool first = !signalled_;
            signalled_ = true;
            // Only a preemption turns this into the power button (see FinalSync).
            if (!stop_signal_at_) stop_signal_at_ = now;
            Log(Severity::kWarning, "signal.received", fmt::format("spotvisor received {}", SignalName(e.signo)),
                {{"signal", SignalName(e.signo)}, {"phase", PhaseName(phase_)}});
            switch (phase_) {
              case Phase::kStarting:
                reason_ = EndReason::kStopped;
                exit_code_ = 128 + e.signo;
                Finish(now, out);
                break;
              case Phase::kRunning: BeginStop(EndReason::kStopped, now, out); break;
              case Phase::kRestoring:
              case Phase::kMounting:
                reason_ = EndReason::kStopped;
                exit_code_ = 128 + e.signo;
                // Downloads and mounts can take many minutes: a stop must not.
                CutShortBeforeTrainer(now, out);
                break;
              case Phase::kSyncing:
                if (!first) {
                  Log(Severity::kWarning, "sync.cancelled", "asked again to stop: the final sync ends now",
                      {{"signal", SignalName(e.signo)}});
                  out.push_back(CancelFinalSync{});
                }
                break;
              case Phase::kRestarting:
                StopFromIdle(EndReason::kStopped, now, out);
                break;
              // A second request to stop means "stop faster" -- but only a
              // second request: GCE presses the power button (systemd's
              // SIGTERM) together with preempted=TRUE, and that must not cut
              // the stop-timeout the trainer gets to save its checkpoint.
              case Phase::kStopping:
                if (!first) {
                  Escalate(now, out, "asked again to stop");
                } else {
                  Log(Severity::kInfo, "signal.ignored",
                      fmt::format("already stopping the trainer ({}): the stop ladder goes on as scheduled",
                                  EndReasonName(*reason_)),
                      {{"signal", SignalName(e.signo)}});
                }
                break;
              case Phase::kHolding:
                // An operator stopping the service ends the hold, not the VM.
                reason_ = reason_ ? reason_ : EndReason::kStopped;
                Teardown(now, out, false);
                break;
              case Phase::kFinishing:
              case Phase::kPoweringOff:
                // The system is going down (likely because we asked it to).
                phase_ = Phase::kDone;
                deadline_.reset();
                out.push_back(ExitProcess{exit_code_});
                break;
              default: break;
            }
          },
          [&](const IdleTimeout& e) {
            if (phase_ != Phase::kRunning) return;
            Log(Severity::kWarning, "idle.detected",
                fmt::format("the trainer has been idle for {}: ending the run", FormatDuration(e.idle)),
                {{"idle_s", std::chrono::duration<double>(e.idle).count()}});
            BeginStop(EndReason::kIdle, now, out);
          },
          [&](const Release&) {
            if (phase_ != Phase::kHolding) return;
            Log(Severity::kNotice, "run.released", "hold released (spotvisor release): going on to on-exit");
            RunOnExitNow(now, out);
          },
          [&](const LeftoversGone&) {
            if (phase_ == Phase::kDraining) AfterDraining(now, out);
          },
          [&](const SyncDone& e) {
            if (!e.final) {
              if (phase_ == Phase::kRestarting && restart_sync_pending_) {
                restart_sync_pending_ = false;
                RestartIfReady(out);
              }
              return;
            }
            if (phase_ != Phase::kSyncing) return;
            if (!e.ok && *reason_ == EndReason::kCompleted) exit_code_ = kExitSyncFailed;
            Finish(now, out);
          },
          [&](const OnExitDone& e) {
            if (phase_ != Phase::kFinishing && phase_ != Phase::kPoweringOff) return;
            Log(e.exit_code == 0 ? Severity::kInfo : Severity::kError, "shutdown.done",
                e.exit_code == 0 ? "on-exit finished" : fmt::format("on-exit failed (exit code {})", e.exit_code),
                {{"exit_code", e.exit_code}});
            if (e.exit_code != 0) {
              // Never leave the VM running by accident.
              PowerOff(now, "on-exit failed", out);
              return;
            }
            EnterPhase(Phase::kDone, now, std::nullopt, "on-exit done");
            out.push_back(ExitProcess{exit_code_});
          },
          [&](const DeadlineReached&) {
            if (!deadline_ || now < *deadline_) return;
            switch (phase_) {
              case Phase::kRunning:
                if (scheduled_stop_at_ && now >= *scheduled_stop_at_) {
                  BeginStop(scheduled_reason_, now, out);
                } else if (max_runtime_at_ && now >= *max_runtime_at_) {
                  Log(Severity::kWarning, "run.max_runtime",
                      fmt::format("max-runtime {} reached: stopping the trainer", FormatDuration(options_.max_runtime)));
                  BeginStop(EndReason::kMaxRuntime, now, out);
                }
                break;
              case Phase::kRestarting:
                if (max_runtime_at_ && now >= *max_runtime_at_) {
                  Log(Severity::kWarning, "run.max_runtime", "max-runtime reached while waiting to restart: not restarting");
                  StopFromIdle(EndReason::kMaxRuntime, now, out);
                  break;
                }
                restart_delay_passed_ = true;
                deadline_ = max_runtime_at_;
                RestartIfReady(out);
                break;
              case Phase::kStopping:
                Escalate(now, out, fmt::format("trainer still running after {}",
                                               FormatDuration(stop_signal_ == SIGINT ? options_.stop_timeout : options_.kill_timeout)));
                break;
              case Phase::kDraining:
                if (leftover_signal_ == SIGTERM) {
                  leftover_signal_ = SIGKILL;
                  out.push_back(SignalLeftovers{SIGKILL});
                  EnterPhase(Phase::kDraining, now, options_.kill_grace, "leftover processes ignored SIGTERM: SIGKILL");
                } else {
                  Log(Severity::kError, "trainer.leftovers", "leftover processes survive SIGKILL; finishing anyway");
                  AfterDraining(now, out);
                }
                break;
              case Phase::kMounting:
                if (!mount_cancelled_) {
                  mount_cancelled_ = true;
                  if (!reason_) {
                    reason_ = EndReason::kMountFailed;
                    exit_code_ = kExitMountFailed;
                  }
                  std::string error = fmt::format("mounting did not finish within {}", FormatDuration(options_.mount_timeout));
                  Log(Severity::kError, "mount.failed", error + "; not starting the trainer", {{"error", error}});
                  out.push_back(CancelMounts{});
                  EnterPhase(Phase::kMounting, now, std::chrono::milliseconds(10'000), "cancelling the mounts");
                } else {
                  // The mount worker did not return: what it mounted cannot be
                  // known, so nothing is unmounted.
                  Log(Severity::kError, "mount.stuck", "the mount step did not return after being cancelled; finishing without unmounting");
                  mounts_active_ = false;
                  Finish(now, out);
                }
                break;
              case Phase::kUnmounting:
                Log(Severity::kError, "mount.unmount_deadline",
                    fmt::format("unmounting did not finish within {}; going on", FormatDuration(options_.unmount_timeout)));
                AfterTeardown(now, out);
                break;
              case Phase::kRestoring:
                reason_ = EndReason::kRestoreFailed;
                exit_code_ = kExitRestoreFailed;
                Log(Severity::kError, "restore.failed", "restore did not finish in time; not starting the trainer");
                Finish(now, out);
                break;
              case Phase::kHolding:
                Log(Severity::kNotice, "run.hold_over", "on-failure-hold is over: going on to on-exit");
                RunOnExitNow(now, out);
                break;
              case Phase::kSyncing:
                Log(Severity::kError, "sync.timeout", "the final sync did not finish in time; finishing without it");
                if (*reason_ == EndReason::kCompleted) exit_code_ = kExitSyncFailed;
                Finish(now, out);
                break;
              case Phase::kFinishing:
              case Phase::kPoweringOff:
                Log(Severity::kError, "shutdown.timeout",
                    phase_ == Phase::kFinishing ? "on-exit did not finish in time" : "shutdown-command did not finish in time");
                out.push_back(CancelOnExit{});
                PowerOff(now, "on-exit did not finish in time", out);
                break;
              default: break;
            }
          },
      },
      event);
  return out;
}

void StateMachine::BeginStop(EndReason reason, SteadyTime now, std::vector<Action>& out) {
  reason_ = reason;
  stop_signal_ = SIGINT;
  Log(Severity::kWarning, "trainer.signal", fmt::format("sending SIGINT to the trainer's process group {}", trainer_pid_),
      {{"signal", "SIGINT"}, {"pgid", trainer_pid_}, {"reason", EndReasonName(reason)}});
  out.push_back(SignalTrainer{SIGINT});
  EnterPhase(Phase::kStopping, now, options_.stop_timeout,
             fmt::format("{}: waiting up to {} for the trainer to stop", EndReasonName(reason), FormatDuration(options_.stop_timeout)));
}

void StateMachine::Escalate(SteadyTime now, std::vector<Action>& out, const std::string& why) {
  int next = stop_signal_ == SIGINT ? SIGTERM : SIGKILL;
  if (stop_signal_ == SIGKILL) {
    Log(Severity::kError, "trainer.unkillable",
        fmt::format("trainer process group {} did not exit after SIGKILL (stuck in the kernel?); finishing anyway", trainer_pid_));
    if (!leader_exited_) exit_code_ = 128 + SIGKILL;
    Finish(now, out);
    return;
  }
  stop_signal_ = next;
  Log(Severity::kWarning, "trainer.signal",
      fmt::format("{}: sending {} to the trainer's process group {}", why, SignalName(next), trainer_pid_),
      {{"signal", SignalName(next)}, {"pgid", trainer_pid_}, {"reason", why}});
  out.push_back(SignalTrainer{next});
  EnterPhase(Phase::kStopping, now, next == SIGTERM ? options_.kill_timeout : options_.kill_grace,
             fmt::format("sent {}", SignalName(next)));
}

void StateMachine::OnTrainerExited(const TrainerExited& e, SteadyTime now, std::vector<Action>& out) {
  if (e.pid != trainer_pid_ || leader_exited_ || (phase_ != Phase::kRunning && phase_ != Phase::kStopping)) return;
  leader_exited_ = true;
  exit_code_ = e.signal != 0 ? 128 + e.signal : e.exit_code;
  nlohmann::json f = {{"pid", e.pid}, {"exit_code", exit_code_}, {"runtime_s", Seconds(now - trainer_started_)}};
  if (e.signal != 0) f["signal"] = SignalName(e.signal);
  if (e.group_remaining > 0) f["group_remaining"] = e.group_remaining;
  std::string how = e.signal != 0 ? fmt::format("killed by {}", SignalName(e.signal)) : fmt::format("exited with code {}", e.exit_code);
  bool ok = exit_code_ == 0 || phase_ == Phase::kStopping;
  Log(ok ? Severity::kInfo : Severity::kError, "trainer.exit", fmt::format("trainer {}", how), f);
  if (!reason_) reason_ = exit_code_ == 0 ? EndReason::kCompleted : EndReason::kFailed;
  if (phase_ == Phase::kStopping && e.group_remaining > 0) {
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
  leftover_signal_ = SIGTERM;
  out.push_back(SignalLeftovers{SIGTERM});
  EnterPhase(Phase::kDraining, now, options_.kill_timeout, "trainer exited: stopping anything it left running");
}

std::optional<SteadyTime> StateMachine::RunningDeadline() const {
  std::optional<SteadyTime> d = max_runtime_at_;
  if (scheduled_stop_at_ && (!d || *scheduled_stop_at_ < *d)) d = scheduled_stop_at_;
  return d;
}

// Notice, not an emergency: save now, stop between steps later. A second
// notice keeps the earlier stop time.
void StateMachine::ScheduleStop(EndReason reason, std::chrono::milliseconds lead, SteadyTime now, std::vector<Action>& out) {
  auto at = now + lead;
  if (scheduled_stop_at_ && *scheduled_stop_at_ <= at) return;
  bool first = !scheduled_stop_at_;
  scheduled_stop_at_ = at;
  scheduled_reason_ = reason;
  if (first && options_.sync) out.push_back(SyncNow{reason == EndReason::kPreempted ? "preemption" : "maintenance"});
  deadline_ = RunningDeadline();
}

// The trainer is not running (between restarts): no ladder, straight to the
// final sync and on-exit.
void StateMachine::StopFromIdle(EndReason reason, SteadyTime now, std::vector<Action>& out) {
  reason_ = reason;
  restart_sync_pending_ = false;
  if (!options_.sync) {
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
  restart_delay_passed_ = false;
  restart_sync_pending_ = options_.sync;
  if (options_.sync) out.push_back(SyncNow{"restart"});
  EnterPhase(Phase::kRestarting, now, delay, options_.sync ? "syncing, then restarting" : "waiting to restart");
  if (max_runtime_at_ && *max_runtime_at_ < *deadline_) deadline_ = max_runtime_at_;
  return true;
}

void StateMachine::RestartIfReady(std::vector<Action>& out) {
  if (!restart_delay_passed_ || restart_sync_pending_) return;
  out.push_back(SpawnTrainer{/*resumed=*/true, restarts_});
}

void StateMachine::AfterDraining(SteadyTime now, std::vector<Action>& out) {
  if (MaybeRestart(now, out)) return;
  if (!options_.sync) {
    Finish(now, out);
    return;
  }
  bool clean = *reason_ == EndReason::kCompleted;
  BeginFinalSync(clean, now, clean ? "final sync, then the DONE marker" : "final sync of the trainer's last checkpoint", out);
}

// Stopped or preempted before the trainer started: nothing there is worth
// waiting for. The mounting phase gets a short deadline to unwind.
void StateMachine::CutShortBeforeTrainer(SteadyTime now, std::vector<Action>& out) {
  if (phase_ == Phase::kRestoring) {
    out.push_back(CancelRestore{});
  } else if (phase_ == Phase::kMounting && !mount_cancelled_) {
    mount_cancelled_ = true;
    out.push_back(CancelMounts{});
    EnterPhase(Phase::kMounting, now, std::chrono::milliseconds(10'000), "cancelling the mounts: the run is ending");
  }
}

void StateMachine::BeginFinalSync(bool write_done, SteadyTime now, const std::string& why, std::vector<Action>& out) {
  auto budget = options_.final_sync_timeout;
  bool urgent = false;
  if (preempted_) {
    // The power button: GCE presses it with preempted=TRUE (or `lead` after
    // it); if spotvisor's SIGTERM came first, that was the button.
    auto button = power_button_at_.value_or(now);
    if (stop_signal_at_ && *stop_signal_at_ < button) button = *stop_signal_at_;
    auto end = button + options_.preemption_window - options_.final_sync_margin;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - now);
    if (left < budget) {
      budget = std::max(left, std::chrono::milliseconds(0));
      urgent = true;
    }
  }
  out.push_back(StartFinalSync{write_done, now + budget, urgent});
  EnterPhase(Phase::kSyncing, now, budget,
             urgent ? fmt::format("{} within the Spot window ({} left)", why, FormatDuration(budget)) : why);
}

void StateMachine::Finish(SteadyTime now, std::vector<Action>& out) {
  // The power button's SIGTERM and preempted=TRUE arrive in either order
  // (or preempted=TRUE first with preemption-stop-lead): it is a preemption.
  if (preempted_ && reason_ == EndReason::kStopped) reason_ = EndReason::kPreempted;
  nlohmann::json f = {{"reason", EndReasonName(*reason_)}, {"exit_code", exit_code_},
                      {"duration_s", Seconds(now - started_)}};
  if (trainer_ran_) f["trainer_runtime_s"] = Seconds(now - trainer_started_);
  Severity s = (*reason_ == EndReason::kFailed) ? Severity::kError : Severity::kNotice;
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
  bool failed = *reason_ == EndReason::kFailed || *reason_ == EndReason::kRestoreFailed || *reason_ == EndReason::kMountFailed;
  if (failed && options_.on_failure_hold.count() > 0) {
    Log(Severity::kWarning, "run.hold",
        fmt::format("the run failed: holding the VM for {} before on-exit, for debugging (end it early with `spotvisor release`)",
                    FormatDuration(options_.on_failure_hold)),
        {{"hold_s", std::chrono::duration<double>(options_.on_failure_hold).count()}});
    EnterPhase(Phase::kHolding, now, options_.on_failure_hold, "on-failure-hold");
    return;
  }
  RunOnExitNow(now, out);
}

void StateMachine::RunOnExitNow(SteadyTime now, std::vector<Action>& out) { Teardown(now, out, true); }

void StateMachine::Teardown(SteadyTime now, std::vector<Action>& out, bool then_on_exit) {
  on_exit_after_teardown_ = then_on_exit;
  if (mounts_active_) {
    mounts_active_ = false;
    out.push_back(StartUnmounts{});
    EnterPhase(Phase::kUnmounting, now, options_.unmount_timeout, "unmounting, in reverse order");
    return;
  }
  AfterTeardown(now, out);
}

bool StateMachine::OnExitVetoed() const { return signalled_ || preempted_; }

void StateMachine::SkipOnExit() {
  Log(Severity::kInfo, "shutdown.skipped",
      !options_.run_on_exit ? "on-exit is none: leaving the machine running"
      : signalled_          ? "spotvisor was stopped by a signal: not running on-exit"
                            : "the VM is being preempted: GCE stops or deletes it (--instance-termination-action), "
                              "so on-exit is not run");
}

bool StateMachine::Ending() const {
  if (signalled_) return true;
  switch (phase_) {
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
      if (failed && phase_ == Phase::kDraining && options_.restart_on_failure && !preempted_) return false;
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
    EnterPhase(Phase::kDone, now, std::nullopt, "run ended");
    out.push_back(ExitProcess{exit_code_});
    return;
  }
  on_exit_started_ = true;
  on_exit_deadline_ = now + options_.on_exit_timeout;
  // Half the budget for the action itself (an API that never answers must
  // not eat it all): the rest is for powering off.
  EnterPhase(Phase::kFinishing, now, options_.on_exit_timeout / 2, "running on-exit");
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
    EnterPhase(Phase::kDone, now, std::nullopt, "powered off by force");
    out.push_back(ExitProcess{exit_code_});
    return;
  }
  ++poweroff_attempts_;
  auto share = left / remaining;
  Log(Severity::kError, "shutdown.poweroff",
      fmt::format("{}: powering off with shutdown-command (attempt {} of {})", why, poweroff_attempts_, options_.poweroff_attempts),
      {{"attempt", poweroff_attempts_}});
  out.push_back(RunPoweroff{poweroff_attempts_});
  EnterPhase(Phase::kPoweringOff, now, share, fmt::format("shutdown-command, attempt {}", poweroff_attempts_));
}

void StateMachine::AfterMounts(SteadyTime now, std::vector<Action>& out) {
  if (options_.sync) {
    out.push_back(StartRestore{});
    EnterPhase(Phase::kRestoring, now, options_.restore_timeout, "restoring the newest complete checkpoint");
    return;
  }
  out.push_back(SpawnTrainer{});
}

}  // namespace spotvisor
