#include "supervisor/state_machine.h"

#include <catch2/catch.hpp>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

// Drives the machine with a clock moved by hand and records what it logs.
struct Harness {
  explicit Harness(StateMachineOptions o = Options()) : machine(o, [this](LogEvent e) { events.push_back(std::move(e)); }) {}

  static StateMachineOptions Options() {
    StateMachineOptions o;
    o.stop_timeout = 20s;
    o.kill_timeout = 5s;
    o.kill_grace = 5s;
    o.on_exit_timeout = 60s;
    o.run_on_exit = true;
    return o;
  }

  std::vector<Action> On(const Event& e) { return machine.Handle(e, now); }
  std::vector<Action> Advance(std::chrono::milliseconds d) {
    now += d;
    return On(DeadlineReached{});
  }
  void StartRunning(int pid = 100) {
    auto a = On(StartEvent{});
    REQUIRE(a.size() == 1);
    REQUIRE(std::holds_alternative<SpawnTrainer>(a[0]));
    On(TrainerSpawned{pid});
    REQUIRE(machine.phase() == Phase::kRunning);
  }
  bool Logged(const std::string& event) const {
    return std::any_of(events.begin(), events.end(), [&](auto const& e) { return e.event == event; });
  }
  const LogEvent& Last(const std::string& event) const {
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      if (it->event == event) return *it;
    }
    FAIL("no event " << event);
    return events.front();
  }

  SteadyTime now{std::chrono::seconds(1000)};
  std::vector<LogEvent> events;
  StateMachine machine;
};

template <typename T>
const T& Only(const std::vector<Action>& a) {
  REQUIRE(a.size() == 1);
  REQUIRE(std::holds_alternative<T>(a[0]));
  return std::get<T>(a[0]);
}

TEST_CASE("a trainer that completes ends the run as completed and runs on-exit once") {
  Harness h;
  h.StartRunning();
  CHECK(Only<SignalLeftovers>(h.On(TrainerExited{100, 0, 0})).signo == SIGTERM);
  CHECK(h.machine.phase() == Phase::kDraining);
  Only<RunOnExit>(h.On(LeftoversGone{}));
  CHECK(h.machine.phase() == Phase::kFinishing);
  CHECK(h.Last("run.end").fields["reason"] == "completed");
  // A second LeftoversGone (e.g. a late reap) must not run on-exit again.
  CHECK(h.On(LeftoversGone{}).empty());
  CHECK(Only<ExitProcess>(h.On(OnExitDone{0})).code == 0);
  CHECK(h.machine.phase() == Phase::kDone);
}

TEST_CASE("the trainer's exit code is passed through, a signal death becomes 128+N") {
  Harness h;
  h.StartRunning();
  h.On(TrainerExited{100, 0, SIGSEGV});
  h.On(LeftoversGone{});
  CHECK(h.machine.exit_code() == 128 + SIGSEGV);
  CHECK(h.Last("run.end").fields["reason"] == "failed");
  CHECK(h.Last("trainer.exit").severity == Severity::kError);
}

TEST_CASE("preemption starts the ladder: SIGINT, SIGTERM after stop-timeout, SIGKILL after kill-timeout") {
  Harness h;
  h.StartRunning();
  CHECK(Only<SignalTrainer>(h.On(PreemptionNotice{})).signo == SIGINT);
  CHECK(h.machine.phase() == Phase::kStopping);
  CHECK(*h.machine.deadline() == h.now + 20s);
  CHECK(h.Advance(19'999ms).empty());  // not yet due
  CHECK(Only<SignalTrainer>(h.Advance(1ms)).signo == SIGTERM);
  CHECK(*h.machine.deadline() == h.now + 5s);
  CHECK(Only<SignalTrainer>(h.Advance(5s)).signo == SIGKILL);
  Only<SignalLeftovers>(h.On(TrainerExited{100, 0, SIGKILL}));
  Only<ExitProcess>(h.On(LeftoversGone{}));
  CHECK(h.Last("shutdown.skipped").message.find("--instance-termination-action") != std::string::npos);
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
  CHECK(h.machine.exit_code() == 137);
}

TEST_CASE("a trainer that stops on SIGINT is not escalated and keeps its exit code") {
  Harness h;
  h.StartRunning();
  h.On(PreemptionNotice{});
  h.now += 3s;
  Only<SignalLeftovers>(h.On(TrainerExited{100, 0, 0}));
  CHECK(h.Advance(30s).size() == 1);  // only the leftover SIGKILL deadline, no trainer signal
  CHECK(h.machine.exit_code() == 0);
  CHECK(*h.machine.end_reason() == EndReason::kPreempted);
}

TEST_CASE("on EC2 the skipped on-exit names the interruption notice, not GCE's termination action") {
  Harness h;
  h.StartRunning();
  h.On(PreemptionNotice{std::nullopt, "EC2 Spot interruption notice (terminate: ...)"});
  h.now += 1s;
  Only<SignalLeftovers>(h.On(TrainerExited{100, 0, 0}));
  h.On(LeftoversGone{});
  auto skipped = h.Last("shutdown.skipped").message;
  CHECK(skipped.find("EC2 Spot interruption notice") != std::string::npos);
  CHECK(skipped.find("EC2 stops, hibernates or terminates it") != std::string::npos);
  CHECK(skipped.find("GCE") == std::string::npos);
}

TEST_CASE("a repeated preemption notice does not restart the ladder") {
  Harness h;
  h.StartRunning();
  h.On(PreemptionNotice{});
  auto deadline = *h.machine.deadline();
  h.now += 1s;
  CHECK(h.On(PreemptionNotice{}).empty());
  CHECK(*h.machine.deadline() == deadline);
}

TEST_CASE("already preempted at startup: the trainer is never started") {
  Harness h;
  Only<ExitProcess>(h.On(StartEvent{true, false}));
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
  CHECK(h.machine.exit_code() == 75);
  CHECK(h.Logged("preemption.detected"));
}

TEST_CASE("TERMINATE maintenance stops the trainer, MIGRATE is only logged") {
  Harness h;
  h.StartRunning();
  CHECK(h.On(MaintenanceNotice{"MIGRATE_ON_HOST_MAINTENANCE"}).empty());
  CHECK(h.machine.phase() == Phase::kRunning);
  CHECK(h.Logged("maintenance.event"));
  CHECK(Only<SignalTrainer>(h.On(MaintenanceNotice{"TERMINATE_ON_HOST_MAINTENANCE"})).signo == SIGINT);
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  CHECK(h.Last("run.end").fields["reason"] == "maintenance");
}

TEST_CASE("SIGTERM to spotvisor stops the trainer, a second one escalates, and on-exit is skipped") {
  Harness h;
  h.StartRunning();
  CHECK(Only<SignalTrainer>(h.On(StopSignal{SIGTERM})).signo == SIGINT);
  CHECK(Only<SignalTrainer>(h.On(StopSignal{SIGINT})).signo == SIGTERM);
  h.On(TrainerExited{100, 0, SIGTERM});
  CHECK(Only<ExitProcess>(h.On(LeftoversGone{})).code == 128 + SIGTERM);
  CHECK(h.Last("run.end").fields["reason"] == "stopped");
  CHECK(h.Logged("shutdown.skipped"));
}

TEST_CASE("leftover processes get SIGTERM, then SIGKILL, then the run finishes anyway") {
  Harness h;
  h.StartRunning();
  h.On(TrainerExited{100, 0, 0});
  CHECK(Only<SignalLeftovers>(h.Advance(5s)).signo == SIGKILL);
  Only<RunOnExit>(h.Advance(5s));
  CHECK(h.Logged("trainer.leftovers"));
}

TEST_CASE("an unkillable trainer does not hang the run") {
  Harness h;
  h.StartRunning();
  h.On(PreemptionNotice{});
  h.Advance(20s);
  h.Advance(5s);
  Only<ExitProcess>(h.Advance(5s));
  CHECK(h.Logged("trainer.unkillable"));
  CHECK(h.machine.exit_code() == 137);
}

TEST_CASE("spawn failure ends the run as failed with 126/127") {
  Harness h;
  h.On(StartEvent{});
  Only<RunOnExit>(h.On(TrainerSpawnFailed{"no such file", 127}));
  CHECK(h.machine.exit_code() == 127);
  CHECK(h.Logged("trainer.start_failed"));
}

TEST_CASE("on-exit none exits without running anything") {
  auto o = Harness::Options();
  o.run_on_exit = false;
  Harness h(o);
  h.StartRunning();
  h.On(TrainerExited{100, 3, 0});
  CHECK(Only<ExitProcess>(h.On(LeftoversGone{})).code == 3);
}

TEST_CASE("a shutdown command that hangs times out into the power-off ladder, a stop signal while finishing exits at once") {
  Harness h;
  h.StartRunning();
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  // Not "exit and leave the VM running": the ladder goes on to power off.
  auto a = h.Advance(30s);
  CHECK(h.Logged("shutdown.timeout"));
  CHECK(h.machine.phase() == Phase::kPoweringOff);
  CHECK(std::any_of(a.begin(), a.end(), [](auto const& x) { return std::holds_alternative<RunPoweroff>(x); }));

  Harness h2;
  h2.StartRunning();
  h2.On(TrainerExited{100, 0, 0});
  h2.On(LeftoversGone{});
  CHECK(Only<ExitProcess>(h2.On(StopSignal{SIGTERM})).code == 0);
}

TEST_CASE("every change is one supervisor.state event naming both states, each once") {
  Harness h;
  h.StartRunning();
  h.On(PreemptionNotice{});
  std::vector<std::string> seen;
  for (auto const& e : h.events) {
    if (e.event != "supervisor.state") continue;
    seen.push_back(e.fields["from"].get<std::string>() + ">" + e.fields["to"].get<std::string>());
    // from, to, why and the deadline: no field says a state again.
    for (auto const& [k, v] : e.fields.items()) CHECK((k == "from" || k == "to" || k == "why" || k == "deadline_s"));
  }
  CHECK(seen == std::vector<std::string>{"starting>running", "running>stopping/SIGINT"});
}

TEST_CASE("events for another pid (a reaped grandchild) are ignored") {
  Harness h;
  h.StartRunning(100);
  CHECK(h.On(TrainerExited{555, 0, 0}).empty());
  CHECK(h.machine.phase() == Phase::kRunning);
}

}  // namespace
}  // namespace spotvisor

namespace spotvisor {
namespace {

TEST_CASE("while stopping, the ladder continues until the trainer's whole group is gone") {
  // sh -c 'python train.py': the shell dies of SIGINT at once while python
  // is still saving its checkpoint. Python must not get SIGTERM for that.
  Harness h;
  h.StartRunning();
  h.On(PreemptionNotice{});
  h.now += 100ms;
  CHECK(h.On(TrainerExited{100, 0, SIGINT, /*group_remaining=*/1}).empty());
  CHECK(h.machine.phase() == Phase::kStopping);
  CHECK(h.Logged("trainer.group_wait"));
  CHECK(h.machine.exit_code() == 130);
  Only<SignalLeftovers>(h.On(GroupEmpty{}));
  CHECK(h.machine.phase() == Phase::kDraining);
}

TEST_CASE("a group that outlives the leader still gets SIGTERM and SIGKILL on schedule") {
  Harness h;
  h.StartRunning();
  h.On(PreemptionNotice{});
  h.On(TrainerExited{100, 0, SIGINT, 2});
  CHECK(Only<SignalTrainer>(h.Advance(20s)).signo == SIGTERM);
  CHECK(Only<SignalTrainer>(h.Advance(5s)).signo == SIGKILL);
  Only<SignalLeftovers>(h.On(GroupEmpty{}));
  CHECK(h.machine.exit_code() == 130);  // the leader's status stays the run's
}

TEST_CASE("in normal running, members left when the leader exits are leftovers") {
  Harness h;
  h.StartRunning();
  CHECK(Only<SignalLeftovers>(h.On(TrainerExited{100, 0, 0, 3})).signo == SIGTERM);
  CHECK(h.machine.phase() == Phase::kDraining);
  CHECK(h.On(GroupEmpty{}).empty());
}


StateMachineOptions SyncOptions() {
  auto o = Harness::Options();
  o.sync = true;
  o.restore_timeout = 60s;
  o.final_sync_timeout = 30s;
  return o;
}

TEST_CASE("with a bucket: restore first, the trainer starts resumed, final sync before on-exit") {
  Harness h(SyncOptions());
  Only<StartRestore>(h.On(StartEvent{}));
  CHECK(h.machine.phase() == Phase::kRestoring);
  CHECK(Only<SpawnTrainer>(h.On(RestoreDone{true, false, true, ""})).resumed);
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  CHECK(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  CHECK(h.machine.phase() == Phase::kSyncing);
  Only<RunOnExit>(h.On(SyncDone{true}));
  CHECK(h.machine.exit_code() == 0);
  CHECK(h.Last("run.end").fields["reason"] == "completed");
}

TEST_CASE("a failed restore never starts the trainer from scratch") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  Only<RunOnExit>(h.On(RestoreDone{false, false, false, "HTTP 503"}));
  CHECK(h.machine.exit_code() == 74);
  CHECK(h.Last("run.end").fields["reason"] == "restore-failed");
  CHECK(h.Logged("restore.failed"));
}

TEST_CASE("a restore that hangs past its deadline fails the same way") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  Only<RunOnExit>(h.Advance(60s));
  CHECK(h.Last("run.end").fields["reason"] == "restore-failed");
  CHECK(h.On(RestoreDone{true, false, false, ""}).empty());  // too late: ignored
}

TEST_CASE("DONE found: no training, straight to on-exit") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  Only<RunOnExit>(h.On(RestoreDone{true, true, false, ""}));
  CHECK(h.Last("run.end").fields["reason"] == "already-done");
  CHECK(h.machine.exit_code() == 0);
}

TEST_CASE("FAILED found (too many failed boots in a row): no training, run-failed (exit 76), on-exit") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  RestoreDone failed;
  failed.run_failed = true;
  Only<RunOnExit>(h.On(failed));
  CHECK(h.Last("run.end").fields["reason"] == "run-failed");
  CHECK(h.Last("run.end").severity == Severity::kError);
  CHECK(h.machine.exit_code() == 76);
  CHECK(*h.machine.end_reason() == EndReason::kRunFailed);
}

TEST_CASE("a stop request (spotvisor stop) stops the trainer gracefully; found at the restore, nothing is trained") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  RestoreDone stopped;
  stopped.run_stopped = true;
  Only<RunOnExit>(h.On(stopped));
  CHECK(h.Last("run.end").fields["reason"] == "stop-requested");
  CHECK(h.machine.exit_code() == 0);
  CHECK(*h.machine.end_reason() == EndReason::kStopRequested);

  Harness running;
  running.StartRunning();
  CHECK(Only<SignalTrainer>(running.On(StopRequested{"spotvisor stop by me@laptop"})).signo == SIGINT);
  CHECK(running.Logged("run.stop_requested"));
  running.On(TrainerExited{100, 0, SIGINT});
  Only<RunOnExit>(running.On(LeftoversGone{}));  // no bucket here: on-exit (in a group: leave it)
  CHECK(running.Last("run.end").fields["reason"] == "stop-requested");
}

TEST_CASE("preempted while restoring: the trainer is not started afterwards") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  Only<CancelRestore>(h.On(PreemptionNotice{}));  // the downloads are cut short
  Only<ExitProcess>(h.On(RestoreDone{true, false, true, ""}));
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
  CHECK(h.machine.exit_code() == 75);
}

TEST_CASE("preemption: the final sync runs without DONE, a failed trainer gets no DONE either") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  h.On(PreemptionNotice{});
  h.On(TrainerExited{100, 130, 0});
  CHECK_FALSE(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  // SIGTERM from systemd while the final sync runs must not cut it short;
  // the system is going down already, so no on-exit on top.
  CHECK(h.On(StopSignal{SIGTERM}).empty());
  CHECK(h.machine.phase() == Phase::kSyncing);
  Only<ExitProcess>(h.On(SyncDone{false}));
  CHECK(h.machine.exit_code() == 130);
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("a trainer that succeeded but whose final sync failed does not exit 0") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  Only<RunOnExit>(h.Advance(30s));
  CHECK(h.Logged("sync.timeout"));
  CHECK(h.machine.exit_code() == 73);
  // Issue #32: not "completed" (NOTICE), and on-exit-failure, not -success.
  CHECK(h.Last("run.end").fields["reason"] == "sync-failed");
  CHECK(h.Last("run.end").severity == Severity::kError);
  CHECK(h.machine.end_reason() == EndReason::kSyncFailed);
}

TEST_CASE("after a preemption the run's last records are bounded by the window, half the margin before its end") {
  auto o = Harness::Options();
  o.preemption_window = 8s;
  o.final_sync_margin = 3s;
  Harness h(o);
  h.StartRunning();
  CHECK_FALSE(h.machine.RecordsDeadline(h.now).has_value());
  h.On(PreemptionNotice{});
  CHECK(h.machine.RecordsDeadline(h.now) == h.now + 6500ms);
}

TEST_CASE("run.end is ERROR where the run's work is at risk, NOTICE for an ordinary end") {
  CHECK(EndSeverity(EndReason::kRestoreFailed) == Severity::kError);
  CHECK(EndSeverity(EndReason::kMountFailed) == Severity::kError);
  CHECK(EndSeverity(EndReason::kFailed) == Severity::kError);
  CHECK(EndSeverity(EndReason::kSyncFailed) == Severity::kError);
  CHECK(EndSeverity(EndReason::kSyncStalled) == Severity::kError);
  CHECK(EndSeverity(EndReason::kGangFormFailed) == Severity::kWarning);
  for (auto r : {EndReason::kCompleted, EndReason::kPreempted, EndReason::kMaintenance, EndReason::kStopped,
                 EndReason::kAlreadyDone, EndReason::kMaxRuntime, EndReason::kIdle, EndReason::kGangEnded}) {
    CHECK(EndSeverity(r) == Severity::kNotice);
  }
}


StateMachineOptions RestartOptions(bool sync = false) {
  auto o = Harness::Options();
  o.sync = sync;
  o.restart_on_failure = true;
  o.max_restarts = 3;
  o.restart_delay = 10s;
  o.restart_delay_max = 25s;
  o.quick_crash = 60s;
  return o;
}

// Starts a trainer (pid) and lets it crash `after` later with `code`.
std::vector<Action> Crash(Harness& h, int pid, std::chrono::milliseconds after, int code = 1) {
  h.On(TrainerSpawned{pid});
  h.now += after;
  h.On(TrainerExited{pid, code, 0});
  return h.On(LeftoversGone{});
}

TEST_CASE("restart=on-failure: a crashed trainer is started again, counted, with growing delays for quick crashes") {
  Harness h(RestartOptions());
  h.On(StartEvent{});
  CHECK(Crash(h, 100, 5s).empty());  // no sync configured: nothing to do but wait
  CHECK(h.machine.phase() == Phase::kRestarting);
  CHECK(*h.machine.deadline() == h.now + 10s);
  auto a = h.Advance(10s);
  CHECK(Only<SpawnTrainer>(a).restart_count == 1);
  CHECK(Only<SpawnTrainer>(a).resumed);
  Crash(h, 101, 5s);
  CHECK(*h.machine.deadline() == h.now + 20s);  // second quick crash: doubled
  CHECK(Only<SpawnTrainer>(h.Advance(20s)).restart_count == 2);
  Crash(h, 102, 5s);
  CHECK(*h.machine.deadline() == h.now + 25s);  // capped
  h.Advance(25s);
  // A fourth failure: max-restarts (3) reached, the run ends as failed.
  Only<RunOnExit>(Crash(h, 103, 5s, 7));
  CHECK(h.Logged("restart.exhausted"));
  CHECK(h.Last("run.end").fields["reason"] == "failed");
  CHECK(h.machine.exit_code() == 7);
  CHECK(h.machine.restarts() == 3);
}

TEST_CASE("a crash loop stops being restarted even when max-restarts allows more") {
  auto o = RestartOptions();
  o.max_restarts = 100;
  o.max_quick_crashes = 3;
  Harness h(o);
  h.On(StartEvent{});
  Crash(h, 100, 1s);
  h.Advance(10s);
  Crash(h, 101, 1s);
  h.Advance(20s);
  Only<RunOnExit>(Crash(h, 102, 1s));  // third quick crash in a row
  CHECK(h.machine.restarts() == 2);
  CHECK(h.Last("restart.exhausted").message.find("crash loop") != std::string::npos);
  CHECK(h.Last("run.end").fields["reason"] == "failed");
}

TEST_CASE("a crash after a long run is not a quick crash: the delay goes back to restart-delay") {
  Harness h(RestartOptions());
  h.On(StartEvent{});
  Crash(h, 100, 5s);
  h.Advance(10s);
  Crash(h, 101, 5s);
  h.Advance(20s);
  Crash(h, 102, 2h);
  CHECK(*h.machine.deadline() == h.now + 10s);
}

TEST_CASE("only failures are restarted: not a clean exit, not our own stop") {
  Harness h(RestartOptions());
  h.On(StartEvent{});
  Only<RunOnExit>(Crash(h, 100, 5s, 0));
  CHECK(h.Last("run.end").fields["reason"] == "completed");

  Harness p(RestartOptions());
  p.On(StartEvent{});
  p.On(TrainerSpawned{100});
  p.On(PreemptionNotice{});
  p.On(TrainerExited{100, 1, 0});  // it exited 1 after our SIGINT
  Only<ExitProcess>(p.On(LeftoversGone{}));
  CHECK(p.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("with a bucket, a restart waits for both the sync and the delay") {
  Harness h(RestartOptions(/*sync=*/true));
  h.On(StartEvent{});
  h.On(RestoreDone{});
  CHECK(Only<SyncNow>(Crash(h, 100, 5s)).kind == "restart");
  CHECK(h.Advance(10s).empty());  // delay over, sync still running
  CHECK(Only<SpawnTrainer>(h.On(SyncDone{true, /*final=*/false})).restart_count == 1);

  Harness h2(RestartOptions(true));
  h2.On(StartEvent{});
  h2.On(RestoreDone{});
  Crash(h2, 100, 5s);
  CHECK(h2.On(SyncDone{true, false}).empty());  // sync done, delay not over
  Only<SpawnTrainer>(h2.Advance(10s));
}

TEST_CASE("preempted while waiting to restart: no restart, final sync, no on-exit") {
  Harness h(RestartOptions(true));
  h.On(StartEvent{});
  h.On(RestoreDone{});
  Crash(h, 100, 5s);
  CHECK_FALSE(Only<StartFinalSync>(h.On(PreemptionNotice{})).write_done);
  CHECK(h.machine.phase() == Phase::kSyncing);
  CHECK(h.On(SyncDone{true, false}).empty());  // the restart's sync finishing late changes nothing
  Only<ExitProcess>(h.On(SyncDone{true, true}));
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("max-runtime: the ladder and the final sync run, run.end says max-runtime") {
  auto o = Harness::Options();
  o.sync = true;
  o.max_runtime = 23h;
  Harness h(o);
  h.On(StartEvent{});
  h.now += 1min;  // restore took a minute: it counts
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  CHECK(*h.machine.deadline() == h.now + 23h - 1min);
  CHECK(Only<SignalTrainer>(h.Advance(23h - 1min)).signo == SIGINT);
  CHECK(h.Logged("run.max_runtime"));
  h.On(TrainerExited{100, 0, 0});
  CHECK_FALSE(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  Only<RunOnExit>(h.On(SyncDone{true}));
  CHECK(h.Last("run.end").fields["reason"] == "max-runtime");
}

TEST_CASE("a maintenance notice with a lead: sync now, stop the trainer at the lead time") {
  auto o = Harness::Options();
  o.sync = true;
  o.maintenance_stop_lead = 50min;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  CHECK(Only<SyncNow>(h.On(MaintenanceNotice{"TERMINATE_ON_HOST_MAINTENANCE"})).kind == "maintenance");
  CHECK(h.machine.phase() == Phase::kRunning);
  CHECK(*h.machine.deadline() == h.now + 50min);
  CHECK(h.On(MaintenanceNotice{"TERMINATE_ON_HOST_MAINTENANCE"}).empty());  // repeated: no second sync
  CHECK(h.Advance(49min).empty());
  CHECK(Only<SignalTrainer>(h.Advance(1min)).signo == SIGINT);
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  Only<RunOnExit>(h.On(SyncDone{true}));
  CHECK(h.Last("run.end").fields["reason"] == "maintenance");
}


TEST_CASE("on-failure-hold: a failed run holds before on-exit, release or the deadline ends it") {
  auto o = Harness::Options();
  o.on_failure_hold = 30min;
  Harness h(o);
  h.StartRunning();
  h.On(TrainerExited{100, 2, 0});
  CHECK(h.On(LeftoversGone{}).empty());
  CHECK(h.machine.phase() == Phase::kHolding);
  CHECK(h.Logged("run.hold"));
  CHECK(*h.machine.deadline() == h.now + 30min);
  Only<RunOnExit>(h.On(Release{}));
  CHECK(h.Logged("run.released"));

  Harness t(o);
  t.StartRunning();
  t.On(TrainerExited{100, 2, 0});
  t.On(LeftoversGone{});
  Only<RunOnExit>(t.Advance(30min));
  CHECK(t.Logged("run.hold_over"));
}

TEST_CASE("no hold after a success, and Release outside a hold does nothing") {
  auto o = Harness::Options();
  o.on_failure_hold = 30min;
  Harness h(o);
  h.StartRunning();
  CHECK(h.On(Release{}).empty());
  h.On(TrainerExited{100, 0, 0});
  Only<RunOnExit>(h.On(LeftoversGone{}));
}


TEST_CASE("preemption-stop-lead: with a notice duration, preemption syncs now and stops at the lead") {
  auto o = Harness::Options();
  o.sync = true;
  o.preemption_stop_lead = 90s;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  CHECK(Only<SyncNow>(h.On(PreemptionNotice{})).kind == "preemption");
  CHECK(h.machine.phase() == Phase::kRunning);
  CHECK(h.Advance(89s).empty());
  CHECK(Only<SignalTrainer>(h.Advance(1s)).signo == SIGINT);
  h.On(TrainerExited{100, 130, 0});
  h.On(LeftoversGone{});
  Only<ExitProcess>(h.On(SyncDone{true}));
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("the power button during the lead starts the ladder at once") {
  auto o = Harness::Options();
  o.preemption_stop_lead = 90s;
  Harness h(o);
  h.StartRunning();
  CHECK(h.On(PreemptionNotice{}).empty());  // no bucket: nothing to sync yet
  h.now += 10s;
  CHECK(Only<SignalTrainer>(h.On(StopSignal{SIGTERM})).signo == SIGINT);
}

TEST_CASE("a maintenance notice after a preemption notice keeps the earlier stop") {
  auto o = Harness::Options();
  o.preemption_stop_lead = 30s;
  o.maintenance_stop_lead = 50min;
  Harness h(o);
  h.StartRunning();
  h.On(PreemptionNotice{});
  h.On(MaintenanceNotice{"TERMINATE_ON_HOST_MAINTENANCE"});
  CHECK(*h.machine.deadline() == h.now + 30s);
  h.Advance(30s);
  h.On(TrainerExited{100, 0, 0});
  Only<ExitProcess>(h.On(LeftoversGone{}));
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}


StateMachineOptions MountOptions() {
  auto o = Harness::Options();
  o.mounts = true;
  o.sync = true;
  o.mount_timeout = 120s;
  o.unmount_timeout = 60s;
  return o;
}

TEST_CASE("mounts come first and are undone last: mount, restore, run, final sync, unmount, on-exit") {
  Harness h(MountOptions());
  Only<StartMounts>(h.On(StartEvent{}));
  CHECK(h.machine.phase() == Phase::kMounting);
  Only<StartRestore>(h.On(MountsDone{true, ""}));
  CHECK(h.machine.phase() == Phase::kRestoring);
  Only<SpawnTrainer>(h.On(RestoreDone{true, false, false, ""}));
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  CHECK(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  Only<StartUnmounts>(h.On(SyncDone{true, true}));
  CHECK(h.machine.phase() == Phase::kUnmounting);
  // on-exit waits for the unmounts (their last uploads) and runs once.
  Only<RunOnExit>(h.On(UnmountsDone{}));
  CHECK(h.machine.phase() == Phase::kFinishing);
  CHECK(h.On(UnmountsDone{}).empty());
  CHECK(Only<ExitProcess>(h.On(OnExitDone{0})).code == 0);
}

TEST_CASE("a mount failure ends the run before restore: exit 72, unmount what was mounted, then on-exit") {
  Harness h(MountOptions());
  h.On(StartEvent{});
  Only<StartUnmounts>(h.On(MountsDone{false, "disk \"data\" did not appear within 1m"}));
  CHECK(h.machine.exit_code() == 72);
  CHECK(h.Last("mount.failed").message.find("did not appear") != std::string::npos);
  CHECK(h.Last("run.end").fields["reason"] == "mount-failed");
  Only<RunOnExit>(h.On(UnmountsDone{{"/mnt/dataset: busy"}}));
  CHECK(h.Logged("mount.unmount_problems"));
}

TEST_CASE("a mount failure with on-failure-hold keeps the mounts during the hold") {
  auto o = MountOptions();
  o.on_failure_hold = 10min;
  Harness h(o);
  h.On(StartEvent{});
  CHECK(h.On(MountsDone{false, "no such bucket"}).empty());
  CHECK(h.machine.phase() == Phase::kHolding);
  Only<StartUnmounts>(h.On(Release{}));
  Only<RunOnExit>(h.On(UnmountsDone{}));
}

TEST_CASE("preempted or stopped while mounting: no trainer, unmount, no on-exit") {
  {
    Harness h(MountOptions());
    h.On(StartEvent{});
    Only<CancelMounts>(h.On(PreemptionNotice{}));  // not worth finishing: cut short
    Only<StartUnmounts>(h.On(MountsDone{true, ""}));
    CHECK(h.machine.exit_code() == 75);
    Only<ExitProcess>(h.On(UnmountsDone{}));
  }
  {
    Harness h(MountOptions());
    h.On(StartEvent{});
    Only<CancelMounts>(h.On(StopSignal{SIGTERM}));
    Only<StartUnmounts>(h.On(MountsDone{true, ""}));
    CHECK(Only<ExitProcess>(h.On(UnmountsDone{})).code == 128 + SIGTERM);
  }
}

TEST_CASE("mounting past its deadline is cancelled, a worker that never returns does not hang the run") {
  Harness h(MountOptions());
  h.On(StartEvent{});
  Only<CancelMounts>(h.Advance(120s));
  CHECK(h.machine.phase() == Phase::kMounting);
  CHECK(h.machine.exit_code() == 72);
  // Cancelled: its own (cancellation) error is not logged as a second failure.
  Only<StartUnmounts>(h.On(MountsDone{false, "cancelled"}));
  CHECK(std::count_if(h.events.begin(), h.events.end(), [](auto& e) { return e.event == "mount.failed"; }) == 1);

  Harness stuck(MountOptions());
  stuck.On(StartEvent{});
  stuck.Advance(120s);
  Only<RunOnExit>(stuck.Advance(10s));  // nothing to unmount that it knows of
  CHECK(stuck.Logged("mount.stuck"));
}

TEST_CASE("an unmount that hangs past its deadline does not keep the VM up") {
  auto o = MountOptions();
  o.sync = false;
  Harness h(o);
  h.On(StartEvent{});
  Only<SpawnTrainer>(h.On(MountsDone{true, ""}));
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 1, 0});
  Only<StartUnmounts>(h.On(LeftoversGone{}));
  Only<RunOnExit>(h.Advance(60s));
  CHECK(h.Logged("mount.unmount_deadline"));
}

TEST_CASE("SIGTERM during a hold unmounts before exiting") {
  auto o = MountOptions();
  o.sync = false;
  o.on_failure_hold = 10min;
  Harness h(o);
  h.On(StartEvent{});
  h.On(MountsDone{true, ""});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 3, 0});
  h.On(LeftoversGone{});
  REQUIRE(h.machine.phase() == Phase::kHolding);
  Only<StartUnmounts>(h.On(StopSignal{SIGTERM}));
  CHECK(Only<ExitProcess>(h.On(UnmountsDone{})).code == 3);
}

TEST_CASE("the power button's SIGTERM right after preempted=TRUE does not cut the trainer's stop-timeout") {
  Harness h;
  h.StartRunning();
  CHECK(Only<SignalTrainer>(h.On(PreemptionNotice{})).signo == SIGINT);
  // systemd stops spotvisor because GCE pressed the power button.
  CHECK(h.On(StopSignal{SIGTERM}).empty());
  CHECK(h.Logged("signal.ignored"));
  CHECK(h.machine.stop_signal() == SIGINT);
  // The ladder goes on as scheduled...
  CHECK(Only<SignalTrainer>(h.Advance(20s)).signo == SIGTERM);
  // ...and a second signal still means "stop faster".
  CHECK(Only<SignalTrainer>(h.On(StopSignal{SIGTERM})).signo == SIGKILL);
  h.On(TrainerExited{100, 0, SIGKILL});
  h.On(LeftoversGone{});
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
  // The system is already going down: no on-exit on top.
  CHECK(h.Logged("shutdown.skipped"));
  CHECK(h.machine.phase() == Phase::kDone);
}

TEST_CASE("SIGTERM first, then preempted=TRUE: still reported as a preemption, no on-exit") {
  Harness h;
  h.StartRunning();
  CHECK(Only<SignalTrainer>(h.On(StopSignal{SIGTERM})).signo == SIGINT);
  CHECK(h.On(PreemptionNotice{}).empty());
  h.On(TrainerExited{100, 0, SIGINT});
  Only<ExitProcess>(h.On(LeftoversGone{}));
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("a stop signal or a preemption while unmounting cancels on-exit") {
  for (int which = 0; which < 2; ++which) {
    auto o = MountOptions();
    o.sync = false;
    Harness h(o);
    h.On(StartEvent{});
    h.On(MountsDone{true, ""});
    h.On(TrainerSpawned{100});
    h.On(TrainerExited{100, 0, 0});
    Only<StartUnmounts>(h.On(LeftoversGone{}));
    if (which == 0) {
      CHECK(h.On(StopSignal{SIGTERM}).empty());
    } else {
      CHECK(h.On(PreemptionNotice{}).empty());
    }
    INFO(which);
    Only<ExitProcess>(h.On(UnmountsDone{}));
    CHECK(h.Logged("shutdown.skipped"));
    CHECK(h.Last("run.end").fields["reason"] == "completed");
  }
}

TEST_CASE("preempted while the final sync of a completed run runs: no on-exit") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  CHECK(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  CHECK(h.On(PreemptionNotice{}).empty());
  Only<ExitProcess>(h.On(SyncDone{true, true}));
  CHECK(h.Last("run.end").fields["reason"] == "completed");
}

TEST_CASE("in a group, a completed run preempted during its final sync still leaves the group") {
  auto o = SyncOptions();
  o.leave_group_when_done = true;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  CHECK(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  CHECK(h.On(PreemptionNotice{}).empty());
  h.On(StopSignal{SIGTERM});  // the power button
  Only<RunOnExit>(h.On(SyncDone{true, true}));  // DONE is in: leave, or the group brings a VM back for nothing
  CHECK(h.Last("run.end").fields["reason"] == "completed");
  // A run the preemption cut short is left to the group, as before.
  Harness cut(o);
  cut.On(StartEvent{});
  cut.On(RestoreDone{});
  cut.On(TrainerSpawned{100});
  cut.On(PreemptionNotice{});
  cut.On(TrainerExited{100, 0, SIGINT});
  Only<StartFinalSync>(cut.On(LeftoversGone{}));
  Only<ExitProcess>(cut.On(SyncDone{true, true}));
  CHECK(cut.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("preemption-stop-lead, then the power button: run.end still says preempted") {
  auto o = SyncOptions();
  o.preemption_stop_lead = 20s;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  Only<SyncNow>(h.On(PreemptionNotice{}));
  CHECK(Only<SignalTrainer>(h.On(StopSignal{SIGTERM})).signo == SIGINT);
  h.On(TrainerExited{100, 0, SIGINT});
  h.On(LeftoversGone{});
  Only<ExitProcess>(h.On(SyncDone{true, true}));
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("a mount failure after a preemption or a stop signal keeps their exit code") {
  {
    Harness h(MountOptions());
    h.On(StartEvent{});
    h.On(PreemptionNotice{});
    Only<StartUnmounts>(h.On(MountsDone{false, "no disk"}));
    CHECK(h.machine.exit_code() == 75);
    CHECK(h.Last("run.end").fields["reason"] == "preempted");
    Only<ExitProcess>(h.On(UnmountsDone{}));
  }
  {
    Harness h(MountOptions());
    h.On(StartEvent{});
    h.On(StopSignal{SIGTERM});
    Only<StartUnmounts>(h.On(MountsDone{false, "no disk"}));
    CHECK(h.machine.exit_code() == 128 + SIGTERM);
  }
}

TEST_CASE("a crash while spotvisor is being stopped or preempted is not restarted") {
  Harness h(RestartOptions());
  h.On(StartEvent{});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 1, 0});  // crashed: draining
  REQUIRE(h.machine.phase() == Phase::kDraining);
  CHECK(h.On(StopSignal{SIGTERM}).empty());
  Only<ExitProcess>(h.On(LeftoversGone{}));
  CHECK(h.Logged("restart.skipped"));
  CHECK(h.machine.restarts() == 0);
}

TEST_CASE("Ending(): not for a crash that may restart or a failure that will hold, yes once stopping") {
  auto o = Harness::Options();
  o.on_failure_hold = 10min;
  Harness h(o);
  h.StartRunning();
  CHECK_FALSE(h.machine.Ending());
  h.On(TrainerExited{100, 1, 0});
  CHECK_FALSE(h.machine.Ending());  // draining a failure that will be held
  h.On(LeftoversGone{});
  REQUIRE(h.machine.phase() == Phase::kHolding);
  CHECK_FALSE(h.machine.Ending());
  h.On(Release{});
  CHECK(h.machine.Ending());

  Harness p;
  p.StartRunning();
  p.On(PreemptionNotice{});
  CHECK(p.machine.Ending());
}
// ---- issue #12: bounded stops, guaranteed power-off ----

template <typename T>
bool Has(const std::vector<Action>& a) {
  return std::any_of(a.begin(), a.end(), [](auto const& x) { return std::holds_alternative<T>(x); });
}

TEST_CASE("on-exit that hangs: abandoned at half the budget, shutdown-command retried, then powered off by force") {
  Harness h;
  h.StartRunning();
  h.On(TrainerExited{100, 0, 0});
  Only<RunOnExit>(h.On(LeftoversGone{}));
  REQUIRE(h.machine.deadline());
  CHECK(*h.machine.deadline() - h.now == 30s);  // half of on-exit-timeout
  // The API never answers: at 30 s it is abandoned and shutdown-command runs.
  auto a = h.Advance(30s);
  CHECK(Has<CancelOnExit>(a));
  REQUIRE(Has<RunPoweroff>(a));
  CHECK(h.machine.phase() == Phase::kPoweringOff);
  // It fails at once: tried again, within the budget.
  auto b = h.On(OnExitDone{1});
  REQUIRE(Has<RunPoweroff>(b));
  CHECK(std::get<RunPoweroff>(b[0]).attempt == 2);
  // It hangs: at its share of what is left, a third attempt, then force.
  auto c = h.Advance(std::chrono::duration_cast<std::chrono::milliseconds>(*h.machine.deadline() - h.now));
  CHECK(Has<RunPoweroff>(c));
  auto d = h.Advance(std::chrono::duration_cast<std::chrono::milliseconds>(*h.machine.deadline() - h.now));
  CHECK(Has<ForcePoweroff>(d));
  CHECK(Has<ExitProcess>(d));
  CHECK(h.Logged("shutdown.forced"));
  CHECK(h.now - SteadyTime{std::chrono::seconds(1000)} <= 60s);  // all within on-exit-timeout
}

TEST_CASE("a failed on-exit powers off with shutdown-command, its success ends the run") {
  Harness h;
  h.StartRunning();
  h.On(TrainerExited{100, 1, 0});
  h.On(LeftoversGone{});
  REQUIRE(Has<RunPoweroff>(h.On(OnExitDone{1})));
  CHECK(Only<ExitProcess>(h.On(OnExitDone{0})).code == 1);
  CHECK_FALSE(h.Logged("shutdown.forced"));
}

TEST_CASE("a stop while restoring cancels the restore, while mounting, the mounts") {
  SECTION("restoring") {
    auto o = Harness::Options();
    o.sync = true;
    Harness h(o);
    Only<StartRestore>(h.On(StartEvent{}));
    auto a = h.On(StopSignal{SIGTERM});
    REQUIRE(Has<CancelRestore>(a));
    // The cancelled restore reports back: the run ends as stopped, not as a failed restore.
    h.On(RestoreDone{false, false, false, "restoring: cancelled"});
    CHECK(h.machine.exit_code() == 128 + SIGTERM);
    CHECK_FALSE(h.Logged("restore.failed"));
  }
  SECTION("mounting") {
    Harness h(MountOptions());
    h.On(StartEvent{});
    auto a = h.On(StopSignal{SIGTERM});
    REQUIRE(Has<CancelMounts>(a));
    REQUIRE(h.machine.deadline());
    CHECK(*h.machine.deadline() - h.now == 10s);  // not mount-timeout
    h.On(MountsDone{false, "cancelled"});
    CHECK_FALSE(h.Logged("mount.failed"));
  }
  SECTION("a preemption while restoring") {
    auto o = Harness::Options();
    o.sync = true;
    Harness h(o);
    h.On(StartEvent{});
    REQUIRE(Has<CancelRestore>(h.On(PreemptionNotice{})));
  }
}

TEST_CASE("a second stop signal during the final sync ends it now, the first does not") {
  auto o = Harness::Options();
  o.sync = true;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  Only<StartFinalSync>(h.On(LeftoversGone{}));
  CHECK_FALSE(Has<CancelFinalSync>(h.On(StopSignal{SIGTERM})));
  CHECK(Has<CancelFinalSync>(h.On(StopSignal{SIGTERM})));
}

TEST_CASE("after a preemption the final sync's deadline is the Spot window, not final-sync-timeout") {
  auto o = Harness::Options();
  o.sync = true;
  o.stop_timeout = 20s;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  h.On(PreemptionNotice{});
  h.now += 5s;  // the trainer saves for 5 s
  h.On(TrainerExited{100, 0, 0});
  h.now += 1s;
  auto a = h.On(LeftoversGone{});
  auto const& f = Only<StartFinalSync>(a);
  CHECK(f.urgent);
  CHECK(f.deadline - h.now == 21s);  // 30 s window - 3 s margin - 6 s gone
  CHECK(*h.machine.deadline() == f.deadline);
}

// ---- issue #12: the state table ----

TEST_CASE("a cancelled restore, mount or final sync that never returns cannot hold the stop: 10 s, then the run ends") {
  SECTION("restore") {
    auto o = Harness::Options();
    o.sync = true;
    Harness h(o);
    h.On(StartEvent{});
    REQUIRE(Has<CancelRestore>(h.On(StopSignal{SIGTERM})));
    CHECK(h.machine.state() == State::kRestoreCancelled);
    CHECK(*h.machine.deadline() - h.now == 10s);  // not the 30 min restore deadline
    CHECK(h.Advance(9s).empty());
    h.Advance(1s);
    CHECK(h.Logged("restore.stuck"));
    CHECK(h.Last("run.end").fields["reason"] == "stopped");
    CHECK(h.machine.exit_code() == 128 + SIGTERM);
    CHECK(h.machine.phase() == Phase::kDone);
  }
  SECTION("mounts") {
    Harness h(MountOptions());
    h.On(StartEvent{});
    h.On(PreemptionNotice{});
    CHECK(h.machine.state() == State::kMountsCancelled);
    h.Advance(10s);
    CHECK(h.Logged("mount.stuck"));
    CHECK(h.machine.exit_code() == 75);
  }
  SECTION("final sync") {
    auto o = Harness::Options();
    o.sync = true;
    Harness h(o);
    h.On(StartEvent{});
    h.On(RestoreDone{true, false, false, ""});
    h.On(TrainerSpawned{100});
    h.On(TrainerExited{100, 0, 0});
    h.On(LeftoversGone{});
    REQUIRE(*h.machine.deadline() - h.now == 10min);
    h.On(StopSignal{SIGTERM});
    h.On(StopSignal{SIGTERM});
    CHECK(h.machine.state() == State::kSyncCancelled);
    CHECK(*h.machine.deadline() - h.now == 10s);
    h.Advance(10s);
    CHECK(h.Logged("sync.timeout"));
    CHECK(h.machine.exit_code() == 73);  // the trainer succeeded, its results did not reach the bucket
    CHECK(h.machine.phase() == Phase::kDone);
  }
}

TEST_CASE("the ladder's rungs are states: each has its own deadline and every change is one supervisor.state event") {
  Harness h;
  h.StartRunning();
  h.On(StopSignal{SIGTERM});
  CHECK(h.machine.state() == State::kStoppingInt);
  CHECK(*h.machine.deadline() - h.now == 20s);
  h.Advance(20s);
  CHECK(h.machine.state() == State::kStoppingTerm);
  CHECK(*h.machine.deadline() - h.now == 5s);
  h.Advance(5s);
  CHECK(h.machine.state() == State::kStoppingKill);
  h.On(TrainerExited{100, 0, SIGKILL});
  CHECK(h.machine.state() == State::kDrainingTerm);
  h.Advance(5s);
  CHECK(h.machine.state() == State::kDrainingKill);
  std::vector<std::string> seen;
  for (auto const& e : h.events) {
    if (e.event != "supervisor.state") continue;
    seen.push_back(e.fields["from"].get<std::string>() + ">" + e.fields["to"].get<std::string>());
  }
  CHECK(seen == std::vector<std::string>{"starting>running", "running>stopping/SIGINT", "stopping/SIGINT>stopping/SIGTERM",
                                         "stopping/SIGTERM>stopping/SIGKILL", "stopping/SIGKILL>draining/SIGTERM",
                                         "draining/SIGTERM>draining/SIGKILL"});
}

TEST_CASE("a restart waits for both its sync and restart-delay, in either order") {
  auto o = Harness::Options();
  o.sync = true;
  o.restart_on_failure = true;
  o.restart_delay = 10s;
  o.quick_crash = 1s;
  for (bool sync_first : {true, false}) {
    CAPTURE(sync_first);
    Harness h(o);
    h.On(StartEvent{});
    h.On(RestoreDone{true, false, false, ""});
    h.On(TrainerSpawned{100});
    h.now += 5s;
    h.On(TrainerExited{100, 1, 0});
    CHECK(Only<SyncNow>(h.On(LeftoversGone{})).kind == "restart");
    CHECK(h.machine.state() == State::kRestartingSyncDelay);
    if (sync_first) {
      CHECK(h.On(SyncDone{true, false}).empty());
      CHECK(h.machine.state() == State::kRestartingDelay);
      CHECK(Only<SpawnTrainer>(h.Advance(10s)).resumed);
    } else {
      CHECK(h.Advance(10s).empty());
      CHECK(h.machine.state() == State::kRestartingSync);
      CHECK(*h.machine.deadline() - h.now == 10min);  // not forever: a hung sync does not hold the restart
      CHECK(Only<SpawnTrainer>(h.On(SyncDone{true, false})).restart_count == 1);
    }
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST_CASE("a restart's sync that never ends does not hold the restart: 10 min, then the trainer starts anyway") {
  auto o = Harness::Options();
  o.sync = true;
  o.restart_on_failure = true;
  o.restart_delay = 10s;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  h.now += 5min;
  h.On(TrainerExited{100, 1, 0});
  h.On(LeftoversGone{});
  h.Advance(10s);
  REQUIRE(h.machine.state() == State::kRestartingSync);
  CHECK(Only<SpawnTrainer>(h.Advance(10min)).resumed);
  CHECK(h.Logged("restart.sync_timeout"));
  h.On(TrainerSpawned{101});
  CHECK(h.machine.phase() == Phase::kRunning);
  CHECK(h.On(SyncDone{true, false}).empty());  // the late answer changes nothing
}

TEST_CASE("docs/architecture.md holds the state table generated from the code") {
  const std::string path = std::string(SPOTVISOR_SOURCE_DIR) + "/docs/architecture.md";
  const std::string begin = "<!-- state-table: generated from lib/supervisor/state_machine.cc (StateMachine::TableMarkdown) -->\n";
  const std::string end = "<!-- end of state-table -->";
  auto doc = ReadFile(path);
  auto b = doc.find(begin);
  auto e = doc.find(end);
  REQUIRE(b != std::string::npos);
  REQUIRE(e != std::string::npos);
  REQUIRE(b < e);
  auto want = StateMachine::TableMarkdown();
  auto have = doc.substr(b + begin.size(), e - b - begin.size());
  if (have != want && std::getenv("SPOTVISOR_UPDATE_DOCS")) {
    std::ofstream(path) << doc.substr(0, b + begin.size()) << want << doc.substr(e);
    have = want;
  }
  INFO("regenerate with: SPOTVISOR_UPDATE_DOCS=1 build-asan/tests/unit_tests \"docs/architecture.md holds*\"");
  CHECK(have == want);
}

TEST_CASE("every state but starting and done has a row for its deadline, so no state can wait forever") {
  std::istringstream md(StateMachine::TableMarkdown());
  std::vector<std::string> deadline_rows;
  for (std::string line; std::getline(md, line);) {
    auto at = line.find(" | `DeadlineReached` |");
    if (at != std::string::npos) deadline_rows.push_back(line.substr(0, at));
  }
  REQUIRE_FALSE(deadline_rows.empty());
  for (int i = 0; i < kStateCount; ++i) {
    auto s = static_cast<State>(i);
    if (s == State::kStarting || s == State::kDone) continue;
    CAPTURE(StateName(s));
    bool covered = std::any_of(deadline_rows.begin(), deadline_rows.end(), [&](const std::string& in) {
      return in.find(std::string("`") + StateName(s) + "`") != std::string::npos ||
             in.find(std::string("`") + PhaseName(PhaseOf(s)) + "/*`") != std::string::npos;
    });
    CHECK(covered);
  }
}


TEST_CASE("sync-stall-action = stop: the trainer gets SIGINT, a final sync without DONE, exit 73, on-exit runs") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  CHECK(Only<SignalTrainer>(h.On(SyncStalled{})).signo == SIGINT);
  CHECK(h.machine.phase() == Phase::kStopping);
  CHECK(h.machine.end_reason() == EndReason::kSyncStalled);
  // The trainer saved on SIGINT and exited 0: still not a success.
  h.On(TrainerExited{100, 0, 0});
  CHECK(h.machine.exit_code() == 73);
  CHECK_FALSE(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  Only<RunOnExit>(h.On(SyncDone{false}));
  CHECK(h.Last("run.end").fields["reason"] == "sync-stalled");
  CHECK(h.Last("run.end").fields["exit_code"] == 73);
  // A trainer that failed on SIGINT keeps its own code.
  Harness h2(SyncOptions());
  h2.On(StartEvent{});
  h2.On(RestoreDone{});
  h2.On(TrainerSpawned{100});
  h2.On(SyncStalled{});
  h2.On(TrainerExited{100, 2, 0});
  CHECK(h2.machine.exit_code() == 2);
}

TEST_CASE("a stall outside the running state changes nothing (the run is ending, or not started)") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  CHECK(h.On(SyncStalled{}).empty());
  CHECK(h.machine.phase() == Phase::kRestoring);
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  h.On(PreemptionNotice{});
  CHECK(h.On(SyncStalled{}).empty());
  CHECK(h.machine.end_reason() == EndReason::kPreempted);
}


TEST_CASE("upcoming-maintenance's window: sync now, stop at the window's stop time, cleared, the stop is cancelled") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  CHECK(Only<SyncNow>(h.On(MaintenanceWindow{h.now + 2h})).kind == "maintenance");
  CHECK(h.machine.deadline() == h.now + 2h);
  // Moved later (rescheduled): the stop follows it.
  h.On(MaintenanceWindow{h.now + 3h});
  CHECK(h.machine.deadline() == h.now + 3h);
  // Cleared: no stop any more.
  CHECK(h.On(MaintenanceWindow{std::nullopt}).empty());
  CHECK_FALSE(h.machine.deadline().has_value());
  h.On(MaintenanceWindow{h.now + 1h});
  CHECK(h.Advance(59min).empty());
  CHECK(Only<SignalTrainer>(h.Advance(1min)).signo == SIGINT);
  h.On(TrainerExited{100, 130, 0});
  h.On(LeftoversGone{});
  h.On(SyncDone{true});
  CHECK(h.Last("run.end").fields["reason"] == "maintenance");
}

TEST_CASE("a window already past (or ONGOING) stops the trainer at once") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  CHECK(Only<SignalTrainer>(h.On(MaintenanceWindow{h.now})).signo == SIGINT);
  CHECK(h.machine.end_reason() == EndReason::kMaintenance);
}

TEST_CASE("with a known window, TERMINATE_ON_HOST_MAINTENANCE stops at the window, not an hour early") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  h.On(MaintenanceWindow{h.now + 55min});
  auto a = h.On(MaintenanceNotice{"TERMINATE_ON_HOST_MAINTENANCE"});
  CHECK(a.empty());  // the sync already ran when the window was announced
  CHECK(h.machine.phase() == Phase::kRunning);
  CHECK(h.machine.deadline() == h.now + 55min);
  CHECK(h.Last("maintenance.detected").message.find("before the window") != std::string::npos);
  // Without a window: at once, as before.
  Harness h2(SyncOptions());
  h2.On(StartEvent{});
  h2.On(RestoreDone{});
  h2.On(TrainerSpawned{100});
  CHECK(Only<SignalTrainer>(h2.On(MaintenanceNotice{"TERMINATE_ON_HOST_MAINTENANCE"})).signo == SIGINT);
}

TEST_CASE("a window announced before the trainer starts is its stop time once it runs") {
  Harness h(SyncOptions());
  h.On(StartEvent{});
  CHECK(h.On(MaintenanceWindow{h.now + 30min}).empty());
  h.On(RestoreDone{});
  h.On(TrainerSpawned{100});
  CHECK(h.machine.deadline() == h.now + 30min);
  CHECK(Only<SignalTrainer>(h.Advance(30min)).signo == SIGINT);
}


TEST_CASE("with a preemption notice, SIGINT still goes out at once, and the final sync has the notice plus the window") {
  auto o = Harness::Options();
  o.sync = true;
  o.preemption_notice = 120s;
  o.final_sync_timeout = 10min;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  CHECK(Only<SignalTrainer>(h.On(PreemptionNotice{})).signo == SIGINT);
  CHECK(h.Last("preemption.detected").fields["notice_s"] == 120.0);
  h.now += 15s;  // a long save
  h.On(TrainerExited{100, 0, 0});
  auto a = h.On(LeftoversGone{});
  auto const& f = Only<StartFinalSync>(a);
  CHECK(f.urgent);
  CHECK(f.deadline - h.now == 132s);  // 120 s notice + 30 s window - 3 s margin - 15 s gone
}

TEST_CASE("a stop lead within the notice: the trainer stops at the lead, the sync window still ends at the notice") {
  auto o = Harness::Options();
  o.sync = true;
  o.preemption_notice = 120s;
  o.preemption_stop_lead = 60s;
  o.final_sync_timeout = 10min;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  CHECK(Only<SyncNow>(h.On(PreemptionNotice{})).kind == "preemption");
  CHECK(Only<SignalTrainer>(h.Advance(60s)).signo == SIGINT);
  h.now += 5s;
  h.On(TrainerExited{100, 0, 0});
  auto a = h.On(LeftoversGone{});
  CHECK(Only<StartFinalSync>(a).deadline - h.now == 82s);  // 150 - 3 - 65
}


TEST_CASE("an EC2 interruption notice: SIGINT at once, the final sync must end before the notice's time") {
  auto o = Harness::Options();
  o.sync = true;
  o.final_sync_timeout = 10min;  // preemption_window stays GCE's 30 s: the notice's time decides
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  CHECK(Only<SignalTrainer>(h.On(PreemptionNotice{h.now + 120s, "EC2 Spot interruption notice (terminate: {})"}))
            .signo == SIGINT);
  auto const& e = h.Last("preemption.detected");
  CHECK(e.fields["ends_in_s"] == 120.0);
  CHECK(e.message.find("EC2 Spot interruption notice") != std::string::npos);
  h.now += 10s;
  h.On(TrainerExited{100, 0, 0});
  auto a = h.On(LeftoversGone{});
  auto const& f = Only<StartFinalSync>(a);
  CHECK(f.urgent);
  CHECK(f.deadline - h.now == 107s);  // 120 s - 3 s margin - 10 s gone
}

TEST_CASE("an EC2 notice seen late: the final sync and the records still end before the notice's time") {
  auto o = Harness::Options();
  o.sync = true;
  o.final_sync_timeout = 10min;
  o.preemption_window = 120s;  // EC2's two minutes
  o.final_sync_margin = 3s;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  auto taken = h.now + 20s;  // seen with 20 s left of the two minutes
  h.On(PreemptionNotice{taken, "EC2 Spot interruption notice (terminate: late)"});
  CHECK(h.Last("preemption.detected").fields["ends_in_s"] == 20.0);
  h.now += 2s;
  h.On(TrainerExited{100, 0, 0});
  auto actions = h.On(LeftoversGone{});
  auto const& f = Only<StartFinalSync>(actions);
  CHECK(f.urgent);
  CHECK(f.deadline == taken - 3s);  // not now + 120 s - 3 s
  auto records = h.machine.RecordsDeadline(h.now);
  REQUIRE(records);
  CHECK(*records <= taken - 1s);
  CHECK(*records > f.deadline);
}

TEST_CASE("an EC2 notice already past still gives no negative budget") {
  auto o = Harness::Options();
  o.sync = true;
  Harness h(o);
  h.On(StartEvent{});
  h.On(RestoreDone{true, false, false, ""});
  h.On(TrainerSpawned{100});
  h.On(PreemptionNotice{h.now - 5s, "late"});
  h.On(TrainerExited{100, 0, 0});
  auto a = h.On(LeftoversGone{});
  CHECK(Only<StartFinalSync>(a).deadline >= h.now);
}


template <typename T>
const T& Find(const std::vector<Action>& a) {
  for (auto const& x : a) {
    if (auto* t = std::get_if<T>(&x)) return *t;
  }
  FAIL("no such action");
  return std::get<T>(a.front());
}

StateMachineOptions GangOptions(bool sync = true) {
  auto o = Harness::Options();
  o.gang = true;
  o.sync = sync;
  o.gang_form_timeout = 60s;
  return o;
}

// Start → restore → forming → formed as `rank` → running.
void FormAndRun(Harness& h, int rank, bool writes) {
  Only<StartRestore>(h.On(StartEvent{}));
  Only<StartForming>(h.On(RestoreDone{true, false, true, ""}));
  REQUIRE(h.machine.state() == State::kForming);
  REQUIRE(h.machine.deadline() == h.now + 60s);
  auto spawn = Only<SpawnTrainer>(h.On(GangFormed{7, rank, writes}));
  CHECK(spawn.resumed);  // what the restore said
  h.On(TrainerSpawned{100});
  REQUIRE(h.machine.phase() == Phase::kRunning);
}

TEST_CASE("gang: the trainer starts only once the gang has formed, after the restore") {
  Harness h(GangOptions());
  FormAndRun(h, 0, true);
  CHECK(h.machine.trainer_pid() == 100);
}

TEST_CASE("gang-checkpoint = all: the gang forms first, then each rank restores its share, then the trainer starts") {
  auto o = GangOptions();
  o.gang_restore_after_forming = true;
  Harness h(o);
  Only<StartForming>(h.On(StartEvent{}));  // no restore before the rank is known
  REQUIRE(h.machine.state() == State::kForming);
  Only<StartRestore>(h.On(GangFormed{7, 2, true}));
  REQUIRE(h.machine.state() == State::kRestoring);
  auto spawn = Only<SpawnTrainer>(h.On(RestoreDone{true, false, true, ""}));
  CHECK(spawn.resumed);
  h.On(TrainerSpawned{100});
  REQUIRE(h.machine.phase() == Phase::kRunning);
  // Every rank syncs its own directory: the final sync after the end is its share.
  h.On(GangEnded{7, "vm-0 (rank 0): preempted", false});
  h.On(TrainerExited{100, 130, 0});
  CHECK(Has<StartFinalSync>(h.On(LeftoversGone{})));
}

TEST_CASE("gang-launch = leader: a host member's stand-in is stopped when rank 0's command completes the gang, and the run is completed") {
  Harness h(GangOptions());
  FormAndRun(h, 1, false);
  auto a = h.On(GangEnded{7, "completed: every member's trainer exited 0", true});
  CHECK(Find<SignalTrainer>(a).signo == SIGINT);
  CHECK_FALSE(Has<EndGang>(a));  // the generation is over already
  h.On(TrainerExited{100, 0, 0});
  CHECK(Has<RunOnExit>(h.On(LeftoversGone{})));
  CHECK(h.Last("run.end").fields["reason"] == "completed");
  CHECK(h.machine.exit_code() == 0);
}

TEST_CASE("gang: without a bucket the gang forms right after the start") {
  Harness h(GangOptions(/*sync=*/false));
  Only<StartForming>(h.On(StartEvent{}));
  CHECK(h.machine.state() == State::kForming);
  Only<SpawnTrainer>(h.On(GangFormed{1, 2, true}));
}

TEST_CASE("gang: a form timeout ends the run before the trainer and runs on-exit") {
  Harness h(GangOptions(false));
  h.On(StartEvent{});
  auto a = h.Advance(60s);
  CHECK(Has<CancelForming>(a));
  CHECK(Has<RunOnExit>(a));
  CHECK(h.Logged("gang.form_timeout"));
  CHECK(h.Last("run.end").fields["reason"] == "gang-form-failed");
  CHECK(h.Last("run.end").fields["exit_code"] == 75);
}

TEST_CASE("gang: members that disagree end the run with exit 78 and on-exit") {
  Harness h(GangOptions(false));
  h.On(StartEvent{});
  auto a = h.On(GangFormFailed{"vm-0 says size 2, vm-1 says 3"});
  CHECK(Has<RunOnExit>(a));
  CHECK(h.Last("run.end").fields["exit_code"] == 78);
}

TEST_CASE("gang: a preemption or a stop while forming cancels forming, no on-exit") {
  for (bool preempt : {true, false}) {
    Harness h(GangOptions(false));
    h.On(StartEvent{});
    auto a = preempt ? h.On(PreemptionNotice{}) : h.On(StopSignal{SIGTERM});
    CHECK(Has<CancelForming>(a));
    CHECK_FALSE(Has<RunOnExit>(a));
    CHECK(h.Last("run.end").fields["reason"] == (preempt ? "preempted" : "stopped"));
    CHECK(h.machine.phase() == Phase::kDone);
  }
}

TEST_CASE("gang: this member's preemption ends the generation for everyone, once") {
  Harness h(GangOptions());
  FormAndRun(h, 0, true);
  auto a = h.On(PreemptionNotice{});
  CHECK(Find<SignalTrainer>(a).signo == SIGINT);
  CHECK(Find<EndGang>(a).why == "preempted");
  // The end record comes back through the watch: no second EndGang.
  CHECK_FALSE(Has<EndGang>(h.On(GangEnded{7, "vm-0 (rank 0): preempted", false})));
  h.On(TrainerExited{100, 130, 0});
  auto s = h.On(LeftoversGone{});
  CHECK_FALSE(Find<StartFinalSync>(s).write_done);
  CHECK(Find<StartFinalSync>(s).urgent);  // inside this VM's Spot window
}

TEST_CASE("gang: another member's end stops the trainer; the survivor syncs (rank 0) and runs on-exit") {
  Harness h(GangOptions());
  FormAndRun(h, 0, true);
  auto a = h.On(GangEnded{7, "vm-2 (rank 2): preempted", false});
  CHECK(Find<SignalTrainer>(a).signo == SIGINT);
  CHECK_FALSE(Has<EndGang>(a));
  CHECK(h.Last("trainer.signal").fields["reason"] == "gang-ended");
  h.On(TrainerExited{100, 130, 0});
  CHECK_FALSE(Only<StartFinalSync>(h.On(LeftoversGone{})).write_done);
  Only<RunOnExit>(h.On(SyncDone{true, true}));
  CHECK(h.Last("run.end").fields["reason"] == "gang-ended");
}

TEST_CASE("gang: a follower (rank > 0, gang-checkpoint = leader) never syncs") {
  Harness h(GangOptions());
  FormAndRun(h, 1, false);
  h.On(GangEnded{7, "vm-0 (rank 0): stopped by a signal", false});
  h.On(TrainerExited{100, 130, 0});
  auto a = h.On(LeftoversGone{});
  CHECK_FALSE(Has<StartFinalSync>(a));
  CHECK(Has<RunOnExit>(a));
}

TEST_CASE("gang: a generation that ends while a member restores after forming starts no trainer; it forms again") {
  auto o = GangOptions();
  o.gang_wait = true;
  o.gang_restore_on_forming = true;
  Harness h(o);
  Only<StartRestore>(h.On(StartEvent{}));
  Only<StartForming>(h.On(RestoreDone{true, false, true, ""}));
  Only<StartRestore>(h.On(GangFormed{7, 0, true}));
  REQUIRE(h.machine.state() == State::kRestoring);
  Only<CancelRestore>(h.On(GangEnded{7, "member vm-1 is gone", false, false}));
  CHECK(h.machine.state() == State::kRestoreCancelled);
  auto a = h.On(RestoreDone{false, false, false, "cancelled"});
  CHECK_FALSE(Has<SpawnTrainer>(a));
  Only<StartForming>(a);
  CHECK(h.Logged("gang.reforming"));
  CHECK_FALSE(h.Logged("run.end"));
}

TEST_CASE("gang: a failed trainer ends the generation with its exit code, once no member was lost") {
  Harness h(GangOptions());
  FormAndRun(h, 1, false);
  CHECK_FALSE(Has<EndGang>(h.On(TrainerExited{100, 3, 0})));  // a lost peer's lease may not have expired yet
  CHECK(h.On(LeftoversGone{}).empty());
  CHECK(h.machine.state() == State::kGangLossCheck);
  CHECK(h.machine.phase() == Phase::kGangWaiting);
  CHECK(h.machine.deadline() == h.now + 15s);
  auto a = h.Advance(15s);
  CHECK(h.Logged("gang.no_loss"));
  auto end = Find<EndGang>(a);
  CHECK(end.why == "trainer failed (exit code 3)");
  CHECK(end.failed);
  CHECK(Has<RunOnExit>(a));
  CHECK(h.Last("run.end").fields["reason"] == "failed");
}

// Issue #28 point 3: a peer killed without a word (a host failure) takes the
// survivors' collective down at once ("Connection closed by peer"); etcd
// says the peer is gone only when its lease expires.
TEST_CASE("gang: a trainer failure followed by a lost member is the gang's loss: with gang-on-loss = wait, form again") {
  auto o = GangOptions();
  o.gang_wait = true;
  Harness h(o);
  FormAndRun(h, 0, true);
  h.On(TrainerExited{100, 1, 0});
  h.On(LeftoversGone{});
  REQUIRE(h.machine.state() == State::kGangLossCheck);
  h.now += 4s;
  auto s = Only<StartFinalSync>(h.On(GangEnded{7, "member vm-2 is gone", false, false}));
  CHECK_FALSE(s.write_done);
  CHECK(h.Logged("gang.loss_taken"));
  CHECK(h.Last("gang.loss_taken").message.find("forming again") != std::string::npos);
  Only<StartForming>(h.On(SyncDone{true, true}));
  CHECK(h.machine.state() == State::kForming);
  CHECK(h.Logged("gang.reforming"));
  CHECK_FALSE(h.Logged("run.end"));
}

TEST_CASE("gang: a lost member heard while the failed trainer's leftovers drain is taken at once") {
  Harness h(GangOptions());  // gang-on-loss = stop: the run ends gang-ended, not failed
  FormAndRun(h, 0, true);
  h.On(TrainerExited{100, 1, 0});
  h.On(GangEnded{7, "vm-1 (rank 1): preempted", false, false});
  auto a = h.On(LeftoversGone{});
  CHECK_FALSE(Has<EndGang>(a));
  CHECK(Has<StartFinalSync>(a));
  CHECK(Has<RunOnExit>(h.On(SyncDone{true, true})));
  CHECK(h.Logged("gang.loss_taken"));
  CHECK(h.Last("run.end").fields["reason"] == "gang-ended");
}

TEST_CASE("gang: a generation ended by another member's own failure leaves this trainer's failure standing") {
  auto o = GangOptions();
  o.gang_wait = true;
  Harness h(o);
  FormAndRun(h, 0, true);
  h.On(TrainerExited{100, 1, 0});
  h.On(LeftoversGone{});
  auto a = h.On(GangEnded{7, "vm-1 (rank 1): trainer failed (exit code 3)", false, true});
  CHECK_FALSE(h.Logged("gang.loss_taken"));
  CHECK_FALSE(Has<EndGang>(a));  // it has ended already
  CHECK(Has<StartFinalSync>(a));
  CHECK(Has<RunOnExit>(h.On(SyncDone{true, true})));
  CHECK_FALSE(h.Logged("gang.reforming"));
  CHECK(h.Last("run.end").fields["reason"] == "failed");
}

TEST_CASE("gang: preempted while waiting to hear of a loss: the failure stands, the generation is ended, no re-forming") {
  auto o = GangOptions();
  o.gang_wait = true;
  Harness h(o);
  FormAndRun(h, 0, true);
  h.On(TrainerExited{100, 1, 0});
  h.On(LeftoversGone{});
  auto a = h.On(PreemptionNotice{});
  CHECK(Find<EndGang>(a).failed);
  CHECK(Has<StartFinalSync>(a));
  h.On(SyncDone{true, true});
  CHECK_FALSE(h.Logged("gang.reforming"));
}

TEST_CASE("gang: a finished trainer waits for the others; DONE only when the whole gang completed") {
  Harness h(GangOptions());
  FormAndRun(h, 0, true);
  h.On(TrainerExited{100, 0, 0});
  Only<GangDone>(h.On(LeftoversGone{}));
  CHECK(h.machine.state() == State::kGangWaiting);
  CHECK(h.machine.deadline() == h.now + 60s);
  auto s = Only<StartFinalSync>(h.On(GangEnded{7, "completed: every member's trainer exited 0", true}));
  CHECK(s.write_done);
  Only<RunOnExit>(h.On(SyncDone{true, true}));
  CHECK(h.Last("run.end").fields["reason"] == "completed");
}

TEST_CASE("gang: a finished trainer whose gang ended otherwise syncs without DONE") {
  Harness h(GangOptions());
  FormAndRun(h, 0, true);
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  auto s = Only<StartFinalSync>(h.On(GangEnded{7, "vm-1 (rank 1): trainer failed (exit code 1)", false}));
  CHECK_FALSE(s.write_done);
  h.On(SyncDone{true, true});
  CHECK(h.Last("run.end").fields["reason"] == "gang-ended");
}

TEST_CASE("gang: a finished trainer waits for the others as long as they are alive, and ends with them") {
  // Issue #28: rank 0's evaluation or export after its last step was cut off
  // when the members that had finished gave up after gang-form-timeout.
  Harness h(GangOptions(false));
  Only<StartForming>(h.On(StartEvent{}));
  h.On(GangFormed{7, 1, false});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  for (int i = 1; i <= 3; ++i) {
    auto a = h.Advance(60s);
    CHECK(a.empty());  // nothing ends: the others are alive and busy
    CHECK(h.machine.phase() == Phase::kGangWaiting);
    CHECK(h.Last("gang.still_waiting").fields["waited_s"] == 60.0 * i);
  }
  CHECK_FALSE(h.Logged("run.end"));
  // The others finish: the generation completes, as always.
  CHECK(Has<RunOnExit>(h.On(GangEnded{7, "completed", true})));
  CHECK(h.Last("run.end").fields["reason"] == "completed");
}

TEST_CASE("gang: a finished trainer's member ends the generation when another member is gone") {
  Harness h(GangOptions(false));
  Only<StartForming>(h.On(StartEvent{}));
  h.On(GangFormed{7, 1, false});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  h.Advance(60s);
  // The gang session reports the loss (its lease expired).
  CHECK(Has<RunOnExit>(h.On(GangEnded{7, "vm-0 (rank 0) is gone (its lease expired)", false})));
  CHECK(h.Last("run.end").fields["reason"] == "gang-ended");
}

TEST_CASE("gang: a finished trainer's member preempted while waiting ends the generation") {
  Harness h(GangOptions(false));
  h.On(StartEvent{});
  h.On(GangFormed{7, 1, false});
  h.On(TrainerSpawned{100});
  h.On(TrainerExited{100, 0, 0});
  h.On(LeftoversGone{});
  auto a = h.On(PreemptionNotice{});
  CHECK(Find<EndGang>(a).why == "preempted");
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("gang: without a gang nothing gang-like happens") {
  Harness h;
  h.StartRunning();
  CHECK_FALSE(Has<EndGang>(h.On(PreemptionNotice{})));
  CHECK(h.On(GangEnded{1, "x", false}).empty());
}


TEST_CASE("gang-on-loss = wait: stopped for another's loss, rank 0 syncs, restores and forms again within the reform timeout") {
  auto o = GangOptions();
  o.gang_wait = true;
  o.gang_reform_timeout = 120s;
  Harness h(o);
  FormAndRun(h, 0, true);
  h.On(GangEnded{7, "vm-2 (rank 2): preempted", false});
  h.On(TrainerExited{100, 130, 0});
  Only<StartFinalSync>(h.On(LeftoversGone{}));
  auto a = h.On(SyncDone{true, true});
  Only<StartForming>(a);
  CHECK(h.Logged("gang.reforming"));
  CHECK_FALSE(h.Logged("run.end"));
  CHECK(h.machine.end_reason() == std::nullopt);
  CHECK(h.machine.deadline() == h.now + 120s);
  // Formed again: then the restore (rank 0's final sync is over by now), then the trainer.
  Only<StartRestore>(h.On(GangFormed{8, 0, true}));
  CHECK(h.machine.state() == State::kRestoring);
  CHECK(Only<SpawnTrainer>(h.On(RestoreDone{true, false, true, ""})).resumed);
  h.On(TrainerSpawned{200});
  CHECK(h.machine.phase() == Phase::kRunning);
  // The new generation's end, with this member's own preemption: no re-forming.
  h.On(PreemptionNotice{});
  h.On(TrainerExited{200, 130, 0});
  h.On(LeftoversGone{});
  h.On(SyncDone{true, true});
  CHECK(h.Last("run.end").fields["reason"] == "preempted");
}

TEST_CASE("gang-on-loss = wait: a follower re-forms without syncing; giving up after the reform timeout runs on-exit") {
  auto o = GangOptions(/*sync=*/false);
  o.gang_wait = true;
  o.gang_reform_timeout = 30s;
  Harness h(o);
  Only<StartForming>(h.On(StartEvent{}));
  h.On(GangFormed{7, 2, false});
  h.On(TrainerSpawned{100});
  h.On(GangEnded{7, "vm-0 (rank 0): preempted", false});
  h.On(TrainerExited{100, 130, 0});
  Only<StartForming>(h.On(LeftoversGone{}));
  CHECK(h.machine.state() == State::kForming);
  auto a = h.Advance(30s);
  CHECK(Has<RunOnExit>(a));
  CHECK(h.Last("gang.form_timeout").message.find("gang-reform-timeout") != std::string::npos);
  CHECK(h.Last("run.end").fields["reason"] == "gang-form-failed");
}


TEST_CASE("gang + restart = on-failure: the failed member ends the generation, waits restart-delay, then forms again") {
  auto o = GangOptions();
  o.gang_wait = true;
  o.restart_on_failure = true;
  o.restart_delay = 10s;
  o.max_restarts = 1;
  Harness h(o);
  FormAndRun(h, 1, false);
  h.On(TrainerExited{100, 3, 0});
  h.On(LeftoversGone{});
  auto a = h.Advance(15s);  // no member was lost
  CHECK(Find<EndGang>(a).why == "trainer failed (exit code 3)");
  CHECK(h.machine.phase() == Phase::kRestarting);
  CHECK(h.Logged("restart.scheduled"));
  Only<StartForming>(h.Advance(10s));
  CHECK(h.machine.state() == State::kForming);
  Only<StartRestore>(h.On(GangFormed{8, 1, false}));
  auto spawn = Only<SpawnTrainer>(h.On(RestoreDone{true, false, true, ""}));
  CHECK(spawn.resumed);
  CHECK(spawn.restart_count == 1);
  h.On(TrainerSpawned{200});
  // The second failure: max-restarts reached, the run ends as failed.
  h.On(TrainerExited{200, 3, 0});
  h.On(LeftoversGone{});
  CHECK(Has<RunOnExit>(h.Advance(15s)));
  CHECK(h.Logged("restart.exhausted"));
  CHECK(h.Last("run.end").fields["reason"] == "failed");
}

}  // namespace
}  // namespace spotvisor
