#include "supervisor/supervisor.h"

#include <sys/reboot.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <csignal>

#include <fmt/format.h>

#include "common/duration.h"
#include "common/json_fields.h"
#include "common/memory.h"
#include "common/units.h"
#include "log/logger.h"
#include "output/utf8.h"
#include "process/proc.h"
#include "metadata/upcoming_maintenance.h"
#include "state/status_file.h"
#include "sync/manifest.h"

namespace spotvisor {

namespace asio = boost::asio;

// Reads one of the trainer's pipes into log lines. \r-rewritten progress
// lines are collapsed by the LineAssembler; its timer emits a pending
// progress line when nothing else arrives.
class Supervisor::OutputPump {
 public:
  OutputPump(asio::io_context& io, int fd, std::string stream, std::string event, Logger& logger,
             const Clock& clock, std::chrono::milliseconds progress_interval)
      : fd_(io, fd),
        timer_(io),
        stream_(std::move(stream)),
        event_(std::move(event)),
        logger_(logger),
        clock_(clock),
        assembler_(output::LineAssemblerOptions{16384, progress_interval}) {
    fd_.non_blocking(true);
  }

  // 16 x 64 KiB per wakeup; leftovers may keep a dead trainer's pipe open
  // and busy, so even the final drain is bounded (16 MiB).
  static constexpr int kReadsPerWakeup = 16;
  static constexpr int kReadsAtExit = 256;

  void Start() { ReadMore(); }
  bool done() const { return done_; }

  // Reads what is already in the pipe, without waiting, but at most
  // `max_reads` chunks: a trainer flooding its output must not keep the loop
  // from handling a preemption. Also called when the trainer has exited, so
  // its last lines are logged before trainer.exit.
  void DrainNow(int max_reads = kReadsPerWakeup) {
    char buf[65536];
    for (int i = 0; i < max_reads; ++i) {
      boost::system::error_code ec;
      std::size_t n = fd_.read_some(asio::buffer(buf), ec);
      if (ec == asio::error::would_block || ec == asio::error::try_again) return;
      if (ec) {
        Finish();
        return;
      }
      Emit(assembler_.Feed(std::string_view(buf, n), clock_.Now()));
    }
  }

  void Close() {
    boost::system::error_code ec;
    timer_.cancel();
    fd_.cancel(ec);
    if (!done_) Finish();
    fd_.close(ec);
  }

 private:
  void ReadMore() {
    if (done_) return;
    fd_.async_wait(asio::posix::stream_descriptor::wait_read, [this](boost::system::error_code ec) {
      if (ec == asio::error::operation_aborted || done_) return;
      DrainNow();
      ArmTick();
      ReadMore();
    });
  }

  void ArmTick() {
    auto due = assembler_.NextDeadline();
    if (!due) return;
    timer_.expires_at(*due);
    timer_.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      Emit(assembler_.Tick(clock_.Now()));
      ArmTick();
    });
  }

  void Finish() {
    done_ = true;
    Emit(assembler_.Flush(clock_.Now()));
  }

  void Emit(const std::vector<output::OutputLine>& lines) {
    for (auto const& l : lines) {
      nlohmann::json f = {{"stream", stream_}};
      if (l.progress) f["progress"] = true;
      if (l.truncated_bytes > 0) f["truncated_bytes"] = l.truncated_bytes;
      logger_.Log(LogEvent{Severity::kInfo, event_, output::EscapeInvalidUtf8(l.text), std::move(f)});
    }
  }

  asio::posix::stream_descriptor fd_;
  asio::steady_timer timer_;
  std::string stream_, event_;
  Logger& logger_;
  const Clock& clock_;
  output::LineAssembler assembler_;
  bool done_ = false;
};

namespace {

// What a gang member runs instead of the command (gang-launch = leader).
std::string SelfExe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : std::string("/usr/bin/spotvisor");
}

// The trainer helper's directory (python/spotvisor.py: `import spotvisor`),
// beside the binary: /usr/share/spotvisor/python for /usr/bin/spotvisor, and
// BUILD/share/spotvisor/python in a build tree. Empty if it is not there.
std::string HelperPythonDir() {
  auto exe = SelfExe();
  auto slash = exe.rfind('/');
  if (slash == std::string::npos) return "";
  auto dir = exe.substr(0, slash) + "/../share/spotvisor/python";
  char real[4096];
  if (realpath(dir.c_str(), real) == nullptr) return "";
  std::string out = real;
  return access((out + "/spotvisor.py").c_str(), R_OK) == 0 ? out : "";
}

// Appends the helper's directory to PYTHONPATH in `env` (after the
// trainer's own entries, so its modules come first).
void AddHelperToPythonPath(std::vector<std::string>& env) {
  static const std::string dir = HelperPythonDir();
  if (dir.empty()) return;
  for (auto& e : env) {
    if (e.rfind("PYTHONPATH=", 0) == 0) {
      e += (e.size() > 11 ? ":" : "") + dir;
      return;
    }
  }
  env.push_back("PYTHONPATH=" + dir);
}

// The checkpoint set of a generation (gang-checkpoint = all): its number,
// when it was formed and the id minted with it (sync/checkpoint_set.h). A
// record from an older version has no id: its set is named as before.
SetId SetOf(const Generation& g, int size) {
  SetId s;
  s.generation = g.number;
  bool id_ok = g.set_id.size() == 16 && g.set_id.find_first_not_of("0123456789abcdef") == std::string::npos;
  auto formed = ParseRfc3339(g.formed_at);
  if (!id_ok || !formed) return s;
  s.id = g.set_id;
  s.minted_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(formed->time_since_epoch()).count();
  s.size = size;
  return s;
}

StateMachineOptions MachineOptions(const SupervisorOptions& so) {
  auto const& c = so.config;
  StateMachineOptions o;
  o.stop_timeout = c.stop_timeout;
  o.on_exit_timeout = c.on_exit_timeout;
  o.kill_timeout = c.kill_timeout;
  auto acts = [](std::optional<OnExit> a) { return a && *a != OnExit::kNone; };
  o.run_on_exit = acts(c.on_exit) || acts(c.on_exit_success) || acts(c.on_exit_failure);
  o.sync = !c.bucket.empty();
  o.restart_on_failure = c.restart_on_failure;
  o.max_restarts = c.max_restarts;
  o.restart_delay = c.restart_delay;
  o.max_runtime = c.max_runtime;
  o.maintenance_stop_lead = c.maintenance_stop_lead;
  o.preemption_stop_lead = c.preemption_stop_lead;
  o.preemption_notice = c.preemption_notice;
  o.preemption_window = c.preemption_window;
  o.on_failure_hold = c.on_failure_hold;
  o.mounts = HasMounts(c);
  // Each step waits up to mount-timeout; formatting a scratch disk may take
  // minutes more.
  o.mount_timeout = 3 * c.mount_timeout + std::chrono::minutes(10);
  // The FUSE driver's exit, plus busy retries and a kill for the disks.
  o.unmount_timeout = kFuseExitWait + std::chrono::seconds(30);
  o.gang = !c.gang.empty();
  o.gang_form_timeout = c.gang_form_timeout;
  o.gang_wait = c.gang_wait_on_loss;
  o.gang_reform_timeout = c.gang_reform_timeout;
  // A lost peer's lease expires within the TTL of its last renewal; the
  // watch that sees it and the end record take a moment more.
  o.gang_loss_grace = c.gang_lease_ttl + std::max<std::chrono::milliseconds>(std::chrono::seconds(5), c.gang_lease_ttl / 2);
  // gang-checkpoint = all: the rank decides which share it restores, so it
  // restores only once formed.
  o.gang_restore_after_forming = !c.gang.empty() && c.gang_checkpoint_all;
  // Every member of a gang restores (again) once the gang formed (issue #28):
  // a member that restored at boot, while rank 0's final sync of the last
  // generation was still going, resumed from an older commit than the others.
  o.gang_restore_on_forming = !c.gang.empty();
  // In a group, a run that completed (DONE is in the bucket) leaves it even
  // when a preemption or a stop came during its final sync: otherwise the
  // group brings back a VM only to find DONE (issue #30).
  o.leave_group_when_done = so.group.has_value() && static_cast<bool>(so.make_group);
  return o;
}

}  // namespace

Supervisor::Supervisor(asio::io_context& io, const Clock& clock, Logger& logger, SupervisorOptions options,
                       asio::signal_set& signals)
    : io_(io),
      clock_(clock),
      logger_(logger),
      options_(std::move(options)),
      machine_(MachineOptions(options_), [this](LogEvent e) { OnMachineEvent(std::move(e)); }),
      signals_(signals),
      deadline_timer_(io),
      sync_timer_(io),
      idle_timer_(io),
      watchdog_timer_(io),
      report_timer_(io),
      stall_timer_(io),
      memory_timer_(io),
      claim_timer_(io),
      stop_check_timer_(io),
      durability_(options_.sync ? options_.config.sync_alert_after : std::chrono::milliseconds(0)) {
  if (auto t = SelfStartTicks(); t.ok()) start_time_ticks_ = *t;
  boot_id_ = BootId();
  if (options_.gang) {
    // Another member's phase changed: status.json and the guest attributes show every member's.
    options_.gang->OnPeersChanged([this] {
      asio::post(io_, [this] {
        if (!exited_) WriteStatus(last_status_event_);
      });
    });
  }
  if (LeaderMode()) {
    ssh_user_ = options_.user ? StatusOr<UserInfo>(*options_.user) : LookupUser(CurrentUserName());
    auto const& file = options_.config.gang_ssh_authorized_keys;
    constexpr std::string_view kSuffix = "/.ssh/authorized_keys";
    if (ssh_user_.ok() && !file.empty()) ssh_user_->home = file.substr(0, file.size() - kSuffix.size());
  }
  observers_.push_back(std::make_unique<StatusFileObserver>(options_.config.state_dir, clock_, logger_));
  if (options_.guest_attributes) observers_.push_back(std::make_unique<GuestAttributesObserver>(options_.guest_attributes));
  if (options_.instance_tags) observers_.push_back(std::make_unique<InstanceTagObserver>(options_.instance_tags));
  if (options_.notifier) observers_.push_back(std::make_unique<SystemdObserver>(io_, clock_, options_.notifier));
  if (options_.sync) {
    // From the worker moving the bytes: on to the loop. The pool is drained
    // in the destructor before io_ goes, so nothing is posted to a dead loop.
    options_.sync->SetProgressHandler([this](const SyncProgress& p) { asio::post(io_, [this, p] { OnTransferProgress(p); }); });
  }
}

void Supervisor::OnTransferProgress(const SyncProgress& p) {
  auto rate = p.Rate();
  auto left = p.SecondsLeft();
  double pct = p.bytes_total > 0 ? 100.0 * static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 100.0;
  std::string what = p.op == "restore" ? "restore" : transfer_kind_ + " sync";
  auto message = fmt::format("{}: {} of {} ({:.0f}%) in {:.1f}s{}{}", what, FormatBytes(p.bytes_done), FormatBytes(p.bytes_total),
                             pct, p.elapsed_s, rate ? ", " + FormatRate(*rate) : "",
                             left ? fmt::format(", about {:.0f}s left", *left) : "");
  nlohmann::json fields = {{"kind", p.op == "restore" ? "restore" : transfer_kind_},
                           {"bytes_done", p.bytes_done},
                           {"bytes_total", p.bytes_total},
                           {"files", p.files_total},
                           {"elapsed_s", p.elapsed_s},
                           {"throughput_mbps", rate ? nlohmann::json(*rate / 1e6) : nlohmann::json(nullptr)},
                           {"eta_s", left ? nlohmann::json(*left) : nlohmann::json(nullptr)}};
  logger_.Info(p.op == "restore" ? "restore.progress" : "sync.progress", message, fields);
  if (p.op != "restore") {
    durability_.Progress(clock_.Now(), p.bytes_done);
    ArmStallTimer();  // a sync moving bytes moves the next look at the lag
  }
  transfer_ = fields;
  transfer_["as_of"] = FormatRfc3339(clock_.WallNow());
  WriteStatus(LogEvent{Severity::kInfo, p.op == "restore" ? "restore.progress" : "sync.progress", message, {}});
}

// Work still in flight (a stuck mount, a hung API) is cancelled and given a
// bound: the process exits on time whatever it was waiting for.
Supervisor::~Supervisor() {
  // No gang callback may post to the loop once this object is gone.
  if (options_.gang) options_.gang->Stop(std::chrono::seconds(2));
  // The run ended here (whatever path it took): the claim goes, within 2 s;
  // if it cannot, it expires by itself.
  if (options_.claim && !claim_released_) {
    CallContext ctx;
    ctx.clock = &clock_;
    ctx.deadline = clock_.Now() + std::chrono::seconds(2);
    ReleaseClaim(ctx);
  }
  CancelAllWork();
  std::size_t left = pool_.Shutdown(std::chrono::seconds(5));
  if (left > 0) {
    logger_.Error("supervisor.stuck_work",
                  fmt::format("{} blocking task(s) did not return within 5s of being cancelled; exiting without them", left));
  }
}

std::shared_ptr<CancelSource> Supervisor::NewWork() {
  auto c = std::make_shared<CancelSource>();
  work_.erase(std::remove_if(work_.begin(), work_.end(), [](auto const& w) { return w.expired(); }), work_.end());
  work_.push_back(c);
  return c;
}

void Supervisor::CancelAllWork() {
  for (auto& w : work_) {
    if (auto c = w.lock()) c->Cancel();
  }
  compute_sleeper_.Cancel();
  if (options_.mounts) options_.mounts->Cancel();
}

void Supervisor::Start() {
  if (auto s = BecomeSubreaper(); !s.ok()) logger_.Warn("supervisor.subreaper", s.message());
  phase_since_ = clock_.WallNow();
  signals_.async_wait([this](auto ec, int signo) {
    if (!ec) OnSignal(signo);
  });
  auto const& c = options_.config;
  logger_.Info("run.start",
               fmt::format("run {} starting as {}: {}", c.run_id, c.user.empty() ? "spotvisor's user" : c.user,
                           c.exec_form ? ShellJoin(c.argv) : c.command),
               // An exec-form command is its words (a JSON array, not JSON
               // inside a string); a shell command is its text.
               {{"run_id", c.run_id}, {"command", c.exec_form ? nlohmann::json(c.argv) : nlohmann::json(c.command)},
                {"user", c.user}, {"workdir", c.workdir},
                {"on_exit", OnExitName(c.on_exit)}, {"mode", options_.mode},
                {"spotvisor_pid", getpid()}});
  if (options_.notifier) {
    // Configuration is loaded and the run has begun: systemd may consider
    // the service started (restore and mounts can take long; STATUS says so).
    options_.notifier->Notify("READY=1");
    if (auto interval = options_.notifier->WatchdogInterval()) {
      logger_.Info("systemd.watchdog", fmt::format("feeding systemd's watchdog every {}", FormatDuration(std::chrono::duration_cast<std::chrono::milliseconds>(*interval / 2))),
                   {{"interval_s", std::chrono::duration<double>(*interval).count()}});
      ArmWatchdog(*interval);
    }
  }
  Dispatch(StartEvent{options_.already_preempted, options_.maintenance_terminate});
}

// WATCHDOG=1 from the event loop itself: if the loop hangs, the pings stop
// and systemd acts (WatchdogSec=).
void Supervisor::ArmWatchdog(std::chrono::microseconds interval) {
  watchdog_timer_.expires_after(interval / 2);
  watchdog_timer_.async_wait([this, interval](boost::system::error_code ec) {
    if (ec || exited_) return;
    options_.notifier->Notify("WATCHDOG=1");
    ArmWatchdog(interval);
  });
}

void Supervisor::NotifyGroupTerminating(const std::string& state) {
  asio::post(io_, [this] { complete_lifecycle_ = true; });
  std::string group = options_.group ? options_.group->Describe() : std::string("the Auto Scaling group");
  // A terminating hook holds the instance for its heartbeat timeout (1 h by
  // default); without one the instance goes at once. Two minutes, as a Spot
  // notice gives, for the final sync either way.
  NotifyPreempted(clock_.WallNow() + std::chrono::minutes(2),
                  fmt::format("{} is terminating this instance (target lifecycle state {})", group,
                              output::EscapeInvalidUtf8(state.substr(0, 40))));
}

void Supervisor::NotifyPreempted(std::optional<WallTime> ends_at, std::string what) {
  asio::post(io_, [this, ends_at, what = std::move(what)] {
    PreemptionNotice n{std::nullopt, what};
    if (ends_at) {
      // Wall time to the loop's steady clock. A time already past, or absurdly
      // far (a skewed clock), is clamped: at least 5 s to sync in, at most 15 min.
      auto in = std::chrono::duration_cast<std::chrono::milliseconds>(*ends_at - clock_.WallNow());
      in = std::clamp(in, std::chrono::milliseconds(5'000), std::chrono::milliseconds(15 * 60'000));
      n.ends_at = clock_.Now() + in;
    }
    Dispatch(n);
  });
}

void Supervisor::NotifyRebalance(const std::string& body) {
  asio::post(io_, [this, body] {
    if (!SyncWrites()) {
      logger_.Log(LogEvent{Severity::kNotice, "rebalance.detected",
                           options_.sync ? "EC2 rebalance recommendation: the instance is at elevated risk of "
                                           "interruption; this gang member does not sync (rank 0 does)"
                                         : "EC2 rebalance recommendation: the instance is at elevated risk of "
                                           "interruption; no bucket is configured, nothing to sync",
                           {{"notice", body}}});
      return;
    }
    logger_.Log(LogEvent{Severity::kNotice, "rebalance.detected",
                         "EC2 rebalance recommendation: the instance is at elevated risk of interruption; syncing "
                         "checkpoints now, the trainer keeps running",
                         {{"notice", body}}});
    StartSync("on-demand", false, false);
  });
}

void Supervisor::NotifyMaintenance(const std::string& value) {
  asio::post(io_, [this, value] { Dispatch(MaintenanceNotice{value}); });
}

void Supervisor::NotifyUpcomingMaintenance(const std::string& body) {
  asio::post(io_, [this, body] { OnUpcomingMaintenance(body); });
}

void Supervisor::OnUpcomingMaintenance(const std::string& body) {
  auto parsed = ParseUpcomingMaintenance(body);
  if (!parsed.ok()) {
    logger_.Warn("maintenance.unreadable", parsed.status().message() + "; ignored (maintenance-event is still watched)");
    return;
  }
  if (!*parsed) {
    if (!maintenance_known_) return;
    maintenance_known_ = false;
    logger_.Info("maintenance.cleared", "upcoming-maintenance: nothing is scheduled any more; a stop it had planned is cancelled");
    Dispatch(MaintenanceWindow{std::nullopt});
    return;
  }
  auto const& m = **parsed;
  maintenance_known_ = true;
  auto const& c = options_.config;
  bool migrates = options_.on_host_maintenance == "MIGRATE";
  std::optional<SteadyTime> stop_at;
  std::string plan;
  if (migrates) {
    plan = "on-host-maintenance is MIGRATE: the VM is live-migrated, the trainer keeps running";
  } else if (m.status == "ONGOING") {
    stop_at = clock_.Now();
    plan = "it is under way: stopping the trainer now";
  } else if (m.window_start) {
    auto stop_wall = *m.window_start - c.maintenance_stop_before;
    stop_at = clock_.Now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(stop_wall - clock_.WallNow());
    plan = stop_wall <= clock_.WallNow()
               ? fmt::format("the window opens in less than maintenance-stop-before ({}): stopping the trainer now",
                             FormatDuration(c.maintenance_stop_before))
               : fmt::format("it will stop this VM: {}stopping the trainer at {} ({} before the window)",
                             options_.sync ? "syncing now, " : "", FormatRfc3339(stop_wall),
                             FormatDuration(c.maintenance_stop_before));
  } else {
    plan = "no window start given: the trainer is stopped when maintenance-event says TERMINATE_ON_HOST_MAINTENANCE";
  }
  std::string reasons;
  for (auto const& r : m.reasons) reasons += (reasons.empty() ? "" : ", ") + output::EscapeInvalidUtf8(r);
  nlohmann::json f = {{"type", m.type},
                      {"status", m.status},
                      {"window_start", m.window_start_text},
                      {"window_end", m.window_end_text},
                      {"latest_window_start", m.latest_window_start_text},
                      {"reasons", m.reasons},
                      {"on_host_maintenance", options_.on_host_maintenance}};
  if (m.can_reschedule) f["can_reschedule"] = *m.can_reschedule;
  if (stop_at) f["stop_in_s"] = std::max(0.0, std::chrono::duration<double>(*stop_at - clock_.Now()).count());
  logger_.Log(LogEvent{Severity::kNotice, "maintenance.scheduled",
                       fmt::format("host maintenance {}{} {}{}{}: {}", m.type.empty() ? "" : m.type + " ",
                                   m.status.empty() ? "" : "(" + m.status + ")",
                                   m.window_start_text.empty() ? "with no window given"
                                                               : "from " + m.window_start_text + " to " + m.window_end_text,
                                   reasons.empty() ? "" : ", reasons: " + reasons,
                                   m.can_reschedule == true ? ", can be rescheduled" : "", plan),
                       std::move(f)});
  Dispatch(MaintenanceWindow{stop_at});
}

void Supervisor::Dispatch(const Event& e) {
  if (exited_) return;
  auto actions = machine_.Handle(e, clock_.Now());
  // The run ended on this VM (run.end: on-exit, a hold, teardown follow; a
  // gang member that waits to form again has not ended): its claim goes,
  // before the actions that follow unmount the bucket (sync-via = mount) or
  // power the VM off. At most 3 s; a claim that stays expires by itself.
  if (auto p = machine_.phase(); options_.claim && !claim_released_ &&
                                 (p == Phase::kHolding || p == Phase::kUnmounting || p == Phase::kFinishing ||
                                  p == Phase::kPoweringOff || p == Phase::kDone)) {
    claim_timer_.cancel();
    CallContext ctx;
    ctx.clock = &clock_;
    ctx.deadline = clock_.Now() + std::chrono::seconds(3);
    // After a preemption, inside the window: a failing store must not keep
    // spotvisor past it (a claim left behind expires by itself).
    if (auto by = machine_.RecordsDeadline(clock_.Now()); by && *by < *ctx.deadline) ctx.deadline = *by;
    if (options_.boot && boot_begun_) {
      BootEnd end;
      end.reason = machine_.end_reason() ? EndReasonName(*machine_.end_reason()) : "ended";
      end.exit_code = machine_.exit_code();
      if (uncommitted_) {
        end.uncommitted_files = uncommitted_->files;
        end.uncommitted_bytes = uncommitted_->bytes;
      }
      if (options_.sync) end.sequence = options_.sync->Committed().sequence;
      if (auto b = options_.boot->End(end, ctx); !b.ok()) logger_.Warn("run.record_failed", b.message());
      CheckBudgetAtEnd(ctx);
    }
    ReleaseClaim(ctx);
    if (complete_lifecycle_ && options_.make_group) {
      complete_lifecycle_ = false;
      CallContext lc;
      lc.clock = &clock_;
      lc.deadline = clock_.Now() + std::chrono::seconds(10);
      if (auto by = machine_.RecordsDeadline(clock_.Now()); by && *by < *lc.deadline) lc.deadline = *by;
      std::vector<std::string> hooks;
      auto client = options_.make_group(compute_sleeper_);
      Status s = client ? client->CompleteTermination(lc, &hooks) : UnavailableError("this instance's region is not known");
      if (s.ok()) {
        logger_.Info("group.lifecycle_completed",
                     hooks.empty() ? std::string("no lifecycle hook holds this instance: the group terminates it now")
                                   : fmt::format("lifecycle action completed (CONTINUE) for hook(s) {}: the group "
                                                 "terminates this instance now",
                                                 fmt::join(hooks, ", ")),
                     {{"hooks", hooks}});
      } else {
        logger_.Warn("group.lifecycle_failed",
                     fmt::format("cannot complete the lifecycle action: {}; the group terminates this instance when the "
                                 "hook's heartbeat timeout ends",
                                 s.message()),
                     {{"error", s.message()}});
      }
    }
  }
  for (auto const& a : actions) Execute(a);
  // The other members' `spotvisor status` shows this one's phase.
  if (options_.gang) {
    std::string phase = PhaseName(machine_.phase());
    if (phase != published_phase_) {
      published_phase_ = phase;
      options_.gang->PublishPhase(phase);
    }
  }
  // status.json once, after the actions: nothing may delay a signal.
  if (last_machine_event_) {
    WriteStatus(*last_machine_event_);
    last_machine_event_.reset();
  }
  ArmDeadline();
}

void Supervisor::ArmDeadline() {
  if (exited_) return;
  auto d = machine_.deadline();
  if (!d) {
    deadline_timer_.cancel();
    return;
  }
  deadline_timer_.expires_at(*d);
  deadline_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec) Dispatch(DeadlineReached{});
  });
}

void Supervisor::Execute(const Action& a) {
  if (auto* sp = std::get_if<struct SpawnTrainer>(&a)) {
    SpawnTrainer(sp->resumed, sp->restart_count);
  } else if (auto* sn = std::get_if<SyncNow>(&a)) {
    StartSync(sn->kind, false, false);
  } else if (std::holds_alternative<struct StartRestore>(a)) {
    StartRestore();
  } else if (auto* fs = std::get_if<StartFinalSync>(&a)) {
    sync_timer_.cancel();
    StartSync("final", true, fs->write_done, fs);
  } else if (auto* s = std::get_if<SignalTrainer>(&a)) {
    // The files the trainer appends to (logs) are known before it stops,
    // so that its final sync takes them for logs, not for a save cut off.
    if (s->signo == SIGINT && options_.sync && !trainer_reaped_) options_.sync->RememberLogs();
    // After the leader is reaped the group may live on; killpg still reaches it.
    if (trainer_pid_ > 0 && killpg(trainer_pid_, s->signo) != 0 && errno != ESRCH) {
      logger_.Error("trainer.signal_failed", fmt::format("killpg({}, {}): {}", trainer_pid_, s->signo, std::strerror(errno)));
    }
  } else if (auto* l = std::get_if<struct SignalLeftovers>(&a)) {
    SignalLeftovers(l->signo);
  } else if (std::holds_alternative<struct StartMounts>(a)) {
    StartMounts();
  } else if (std::holds_alternative<CancelMounts>(a)) {
    if (options_.mounts) options_.mounts->Cancel();
  } else if (std::holds_alternative<CancelRestore>(a)) {
    if (restore_cancel_) restore_cancel_->Cancel();
  } else if (std::holds_alternative<CancelFinalSync>(a)) {
    if (final_cancel_) final_cancel_->Cancel();
  } else if (std::holds_alternative<struct StartUnmounts>(a)) {
    StartUnmounts();
  } else if (std::holds_alternative<struct RunOnExit>(a)) {
    RunOnExit();
  } else if (std::holds_alternative<CancelOnExit>(a)) {
    AbandonOnExit();
  } else if (std::holds_alternative<struct RunPoweroff>(a)) {
    AbandonOnExit();
    RunPoweroff();
  } else if (std::holds_alternative<struct ForcePoweroff>(a)) {
    ForcePoweroff();
  } else if (std::holds_alternative<struct StartForming>(a)) {
    StartForming();
  } else if (std::holds_alternative<CancelForming>(a)) {
    // Leaving revokes the lease: off the loop, bounded.
    if (auto gang = options_.gang) pool_.Post([gang] { gang->Stop(std::chrono::seconds(2)); });
  } else if (auto* eg = std::get_if<EndGang>(&a)) {
    if (options_.gang && gang_generation_) {
      options_.gang->End(gang_generation_->number,
                         fmt::format("{} (rank {}): {}", options_.gang->options().self.instance, gang_rank_, eg->why),
                         eg->failed);
    }
  } else if (std::holds_alternative<GangDone>(a)) {
    if (options_.gang && gang_generation_) options_.gang->Done(gang_generation_->number);
  } else if (auto* x = std::get_if<ExitProcess>(&a)) {
    Exit(x->code);
  }
}

void Supervisor::SpawnTrainer(bool resumed, int restart_count) {
  auto const& c = options_.config;
  SpawnOptions o;
  o.argv = c.argv;
  if (LeaderMode() && gang_rank_ > 0) {
    // gang-launch = leader: rank 0's mpiexec runs this VM's share over ssh;
    // this member runs a stand-in that ends (0) when the generation does.
    o.argv = {SelfExe(), "gang-host"};
    o.blocked_signals = {SIGINT, SIGTERM, SIGHUP};  // it sigwaits for them
  }
  o.env = options_.base_env;
  for (auto const& [k, v] : c.env) o.env.push_back(k + "=" + v);
  for (auto const& [k, v] : SpotvisorEnv(c)) o.env.push_back(k + "=" + v);
  o.env.push_back(std::string("SPOTVISOR_RESUMED=") + (resumed ? "1" : "0"));
  o.env.push_back("SPOTVISOR_RESTART_COUNT=" + std::to_string(restart_count));
  AddHelperToPythonPath(o.env);
  for (auto const& e : GangEnv()) o.env.push_back(e);
  if (LeaderMode() && gang_rank_ == 0) {
    // mpiexec's ssh: this generation's key, to sshd on gang-ssh-port; host
    // keys are not pinned (a member recreated by a managed instance group
    // has a new one), the key and from= pin who may connect instead.
    auto key = SshKeyPath();
    o.env.push_back("SPOTVISOR_GANG_SSH_KEY=" + key);
    o.env.push_back(fmt::format("OMPI_MCA_plm_rsh_args=-i {} -p {} -o IdentitiesOnly=yes -o BatchMode=yes "
                                "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
                                key, c.gang_ssh_port));
  }
  o.workdir = c.workdir;
  o.user = options_.user;
  o.capture_output = true;
  // Remembered before the trainer can write anything: if spotvisor dies while
  // it runs, the next start knows local changes may be a save cut off.
  NoteTrainerRunning(true);
  auto spawned = Spawn(o);
  if (!spawned.ok()) {
    NoteTrainerRunning(false);
    // 127: not found, 126: found but not runnable, as shells and tini report it.
    int code = spawned.status().code() == StatusCode::kNotFound ? 127 : 126;
    Dispatch(TrainerSpawnFailed{spawned.status().message(), code});
    return;
  }
  trainer_pid_ = spawned->pid;
  trainer_reaped_ = false;
  pumps_.push_back(std::make_unique<OutputPump>(io_, spawned->stdout_fd, "stdout", "trainer.output", logger_, clock_,
                                                c.progress_interval));
  pumps_.push_back(std::make_unique<OutputPump>(io_, spawned->stderr_fd, "stderr", "trainer.output", logger_, clock_,
                                                c.progress_interval));
  bool stand_in = o.argv != c.argv;
  logger_.Info("trainer.start",
               stand_in ? fmt::format("gang-launch = leader: rank 0 runs the command; this member hosts its processes, "
                                      "with `spotvisor gang-host` as pid {} until the generation ends",
                                      trainer_pid_)
               : restart_count ? fmt::format("trainer started again as pid {} (restart {})", trainer_pid_, restart_count)
                               : fmt::format("trainer started as pid {}", trainer_pid_),
               {{"pid", trainer_pid_}, {"argv", o.argv}, {"user", c.user}, {"workdir", c.workdir}, {"resumed", resumed},
                {"restart_count", restart_count}, {"gang_host", stand_in}});
  for (auto& p : pumps_) p->Start();
  Dispatch(TrainerSpawned{trainer_pid_});
  if (stall_stop_pending_ && durability_.level() == 2) Dispatch(SyncStalled{});
  stall_stop_pending_ = false;
  ArmSyncTimer();
  if (c.idle_timeout.count() > 0) {
    if (!sampler_) {
      sampler_ = MakeProcActivitySampler();
      if (auto why = sampler_->GpuUnavailableReason(); !why.empty()) logger_.Info("idle.gpu_unavailable", why);
    }
    idle_.emplace(c.idle_threshold, c.idle_threshold);
    idle_->Reset(clock_.Now());
    ArmIdleTimer();
  }
}

// Samples the trainer's tree ten times per idle-timeout (every 100 ms to
// 10 s): reading /proc for one tree is cheap enough for the loop.
void Supervisor::ArmIdleTimer() {
  auto timeout = options_.config.idle_timeout;
  auto every = std::clamp<std::chrono::milliseconds>(timeout / 10, std::chrono::milliseconds(100), std::chrono::seconds(10));
  idle_timer_.expires_after(every);
  idle_timer_.async_wait([this, timeout](boost::system::error_code ec) {
    if (ec || exited_ || machine_.phase() != Phase::kRunning) return;
    auto idle = idle_->Observe(clock_.Now(), sampler_->Sample(trainer_pid_));
    if (idle >= timeout) {
      Dispatch(IdleTimeout{idle});
      return;
    }
    ArmIdleTimer();
  });
}

void Supervisor::NoteTrainerRunning(bool running) {
  if (!options_.sync) return;
  if (auto w = options_.sync->NoteTrainerRunning(running); !w.empty()) logger_.Warn("sync.state_not_saved", w);
}

void Supervisor::StartRestore() {
  auto engine = options_.sync;
  logger_.Info("restore.start", fmt::format("looking for a checkpoint in {}", engine->Describe()),
               {{"bucket", engine->Describe()}});
  CallContext ctx;
  ctx.clock = &clock_;
  ctx.cancel = restore_cancel_ = NewWork();
  transfer_kind_ = "restore";
  auto run = options_.gang_run_store;
  int rank = gang_rank_, size = options_.config.gang_size;
  ArmClaimTimer();
  auto claim = options_.claim;
  auto boot = boot_begun_ ? nullptr : options_.boot;
  auto budget = boot ? options_.budget : nullptr;  // once per process, like the record
  boot_begun_ = true;
  pool_.Post([this, engine, ctx, run, rank, size, claim, boot, budget] {
    // Live on the run from before the restore on (issue #28): `spotvisor gc`
    // on a laptop must not delete what this VM is about to restore.
    if (claim) {
      if (auto c = claim->Renew("restoring", ctx); !c.ok()) {
        asio::post(io_, [this, c] { logger_.Warn("run.claim_failed", c.message() + "; `spotvisor gc` may take this run for ended"); });
      }
    }

    if (run) {
      // gang-checkpoint = all: this rank's manifest becomes its share of the
      // newest complete set first, so no rank resumes from a save the
      // others do not have.
      auto rb = RollBackToNewestSet(*run, rank, size, ctx);
      if (!rb.ok()) {
        asio::post(io_, [this, s = rb.status()] {
          transfer_ = nullptr;
          Dispatch(RestoreDone{false, false, false,
                               "gang-checkpoint = all: cannot find the gang's newest complete checkpoint set: " + s.message()});
        });
        return;
      }
      asio::post(io_, [this, rb = *rb, rank] {
        nlohmann::json f = {{"rank", rank}, {"set_generation", rb.set ? nlohmann::json(rb.set->generation) : nlohmann::json(nullptr)},
                            {"set_id", rb.set ? nlohmann::json(rb.set->id) : nlohmann::json(nullptr)},
                            {"rolled_back", rb.changed}, {"shares_dropped", rb.shares_dropped}, {"set_aside", rb.set_aside}};
        std::string aside = rb.set_aside.empty()
                                ? std::string()
                                : fmt::format("; its own commit is kept in the bucket as {} (nothing committed is deleted)",
                                              rb.set_aside);
        std::string message;
        if (rb.set && rb.set_aside.empty() && (rb.set->size == 0 || rank < rb.set->size)) {
          message = fmt::format("rank {} restores its share of {}, the newest one every rank committed{}", rank,
                                rb.set->Describe(), rb.changed ? " (its own newer commit is not used)" : "");
        } else if (rb.set) {
          message = fmt::format("rank {} is beyond {} (the gang grew): it starts from scratch, the other ranks resume "
                                "from the set{}",
                                rank, rb.set->Describe(), aside);
        } else {
          message = fmt::format("rank {}: no checkpoint set is complete yet: every rank starts from scratch{}", rank, aside);
        }
        logger_.Log(LogEvent{rb.set_aside.empty() ? Severity::kInfo : Severity::kWarning, "gang.set_restore", message, f});
      });
    }
    // The run's budget of failed boots (issue #30): a run marked failed
    // does not train again; the failed boots before this one are counted
    // for when this one ends.
    if (budget) {
      std::vector<std::string> problems;
      auto b = budget->Check(ctx, &problems);
      bool marked = b.ok() && (b->failed_marker || b->stop_request);
      if (b.ok() && b->budget_reset && boot) boot->SetBudgetReset();
      bool stopped = b.ok() && b->stop_request;
      asio::post(io_, [this, b, problems, budget] {
        for (auto const& p : problems) logger_.Warn("run.record_unreadable", p + " (not counted)");
        if (!b.ok()) {
          logger_.Warn("run.budget_unknown", "cannot count the run's failed boots: " + b.status().message());
        } else if (b->stop_request) {
          logger_.Log(LogEvent{Severity::kNotice, "run.stop_requested",
                               fmt::format("{}/{} is there (`spotvisor stop`): this run is not trained again (delete it "
                                           "to go on)",
                                           options_.config.run_id, kStopObject),
                               {{"by", JsonString(*b->stop_request, "by")}}});
        } else if (b->failed_marker) {
          logger_.Log(LogEvent{Severity::kError, "run.marked_failed",
                               fmt::format("{} is there: this run failed at too many boots in a row; not training "
                                           "again (delete it, or use a new run-id, once the cause is fixed)",
                                           budget->MarkerName()),
                               {{"marker", *b->failed_marker}}});
        } else {
          failed_before_ = b->failed_in_a_row;
          if (b->budget_reset) {
            logger_.Log(LogEvent{Severity::kNotice, "run.budget_reset",
                                 fmt::format("the run's failed boots used up max-failed-boots, but {} is gone (deleted "
                                             "to let the run go on): the count starts again with this boot",
                                             budget->MarkerName())});
          }
        }
      });
      if (marked) {
        if (boot) (void)boot->Begin(ctx);
        asio::post(io_, [this, stopped] {
          transfer_ = nullptr;
          RestoreDone done;
          done.run_stopped = stopped;
          done.run_failed = !stopped;
          Dispatch(done);
        });
        return;
      }
    }
    auto r = engine->Restore(ctx);
    // This boot in the run's history (once per process, not per restore),
    // once the restore has looked at the bucket: the claim came first.
    if (boot) {
      if (auto b = boot->Begin(ctx); !b.ok()) {
        asio::post(io_, [this, b] { logger_.Warn("run.record_failed", b.message()); });
      }
    }
    asio::post(io_, [this, r = std::move(r)] {
      transfer_ = nullptr;
      if (r.ok() && !r->state_warning.empty()) logger_.Warn("sync.state_not_saved", r->state_warning);
      if (!r.ok()) {
        Dispatch(RestoreDone{false, false, false, r.status().message()});
        return;
      }
      restored_ = true;
      ScheduleMemoryRelease();
      if (!r->done) {
        // The bucket holds what the trainer starts from (or, with newer
        // local files kept, held them before this boot).
        durability_.CaughtUp(clock_.Now(), clock_.WallNow(), clock_.Now());
        ArmStallTimer();
        ArmReportTimer();
        ArmStopCheck();
        PublishRunStatus({{"state", "running"}});
      }
      if (r->done) {
        logger_.Log(LogEvent{Severity::kNotice, "run.already_done",
                             fmt::format("{} has a DONE marker: this run already finished; not training again",
                                         options_.sync->Describe()),
                             {{"marker", r->done_marker}, {"garbage_deleted", r->garbage_deleted}}});
      } else if (r->kept_local) {
        logger_.Log(LogEvent{Severity::kNotice, "restore.kept_local",
                             fmt::format("{} file(s) in {} changed since commit #{}, which this disk already holds: keeping "
                                         "them (newer than the bucket); the next sync uploads them",
                                         r->local_changes, options_.config.checkpoint_dir, r->sequence),
                             {{"sequence", r->sequence}, {"local_changes", r->local_changes}}});
      } else if (r->resumed) {
        if (!r->bucket_won.empty()) {
          // In a gang another member commits (rank 0, or the set's other
          // ranks): the bucket being ahead of this disk is the normal case,
          // worth a warning only when local files had to be set aside.
          logger_.Log(LogEvent{options_.gang && r->set_aside == 0 ? Severity::kInfo : Severity::kWarning,
                               "restore.bucket_newer", r->bucket_won,
                               {{"sequence", r->sequence}, {"set_aside", r->set_aside}, {"set_aside_dir", r->set_aside_dir}}});
        }
        std::string cleaned;
        if (r->stale_temps_removed > 0) {
          cleaned += fmt::format("; removed {} temporary file(s) ({}) of an earlier restore that was cut off",
                                 r->stale_temps_removed, FormatBytes(r->stale_temp_bytes));
        }
        if (r->stale_dropped > 0) {
          cleaned += fmt::format("; deleted {} stale local cop(ies) of files the commit replaces ({}) first, "
                                 "the disk had no room for both",
                                 r->stale_dropped, FormatBytes(r->stale_dropped_bytes));
        }
        logger_.Info("restore.complete",
                     fmt::format("restored checkpoint #{}: {} file(s), {} downloaded ({}) in {:.2f}s{}", r->sequence,
                                 r->files, r->files_downloaded, FormatBytes(r->bytes_downloaded), r->seconds, cleaned),
                     {{"sequence", r->sequence}, {"files", r->files}, {"files_downloaded", r->files_downloaded},
                      {"bytes", r->bytes_downloaded}, {"duration_s", r->seconds},
                      {"stale_temps_removed", r->stale_temps_removed}, {"stale_dropped", r->stale_dropped}});
      } else {
        logger_.Info("restore.none", "no checkpoint in the bucket yet: the trainer starts from scratch");
      }
      Dispatch(RestoreDone{true, r->done, r->resumed, ""});
    });
  });
}

void Supervisor::StartMounts() {
  auto mounts = options_.mounts;
  if (!mounts) {
    asio::post(io_, [this] { Dispatch(MountsDone{false, "internal: mounts configured but no mount manager"}); });
    return;
  }
  mounts->set_on_fuse_exit([this](pid_t pid, int status) {
    asio::post(io_, [this, pid, status] {
      // While mounting, the mount step reports the driver's exit itself.
      if (options_.mounts->unmounting() || machine_.phase() == Phase::kMounting) return;
      // Reads and writes under the mount now fail with "transport endpoint
      // is not connected"; the trainer will see errors of its own.
      logger_.Error("mount.fuse_died",
                    fmt::format("the {} process (pid {}) mounting {} {} during the run: files under {} cannot be read or "
                                "written any more",
                                options_.config.mount_driver, pid, options_.config.bucket, DescribeWaitStatus(status),
                                options_.config.bucket_mount),
                    {{"pid", pid}, {"driver", options_.config.mount_driver}, {"dir", options_.config.bucket_mount}});
    });
  });
  pool_.Post([this, mounts] {
    Status s = mounts->MountAll();
    asio::post(io_, [this, s] { Dispatch(MountsDone{s.ok(), s.message()}); });
  });
}

void Supervisor::StartUnmounts() {
  auto mounts = options_.mounts;
  pool_.Post([this, mounts] {
    std::vector<std::string> problems;
    if (mounts) problems = mounts->UnmountAll();
    asio::post(io_, [this, problems] { Dispatch(UnmountsDone{problems}); });
  });
}

// Phases where the trainer's progress is expected to reach the bucket.
static bool Training(Phase p) { return p == Phase::kRunning || p == Phase::kRestarting; }

void Supervisor::CountUncommitted(std::function<void()> then) {
  // One scan at a time; whoever asks meanwhile gets its result too.
  count_waiters_.push_back(std::move(then));
  if (count_waiters_.size() > 1) return;
  auto engine = options_.sync;
  pool_.Post([this, engine] {
    auto u = engine->Uncommitted();
    asio::post(io_, [this, u = std::move(u)] {
      auto waiters = std::move(count_waiters_);
      count_waiters_.clear();
      if (exited_) return;
      if (u.ok()) {
        uncommitted_ = *u;
        uncommitted_as_of_ = clock_.WallNow();
      } else {
        logger_.Warn("checkpoint.count_failed", "cannot count what is not committed yet: " + u.status().message());
      }
      for (auto& w : waiters) w();
    });
  });
}

void Supervisor::ArmReportTimer() {
  auto interval = options_.config.checkpoint_report_interval;
  if (!SyncWrites() || interval.count() == 0 || exited_) return;
  report_timer_.expires_after(interval);
  report_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || exited_ || !SyncWrites()) return;
    if (machine_.phase() == Phase::kDone) return;
    CountUncommitted([this] {
      logger_.Log(durability_.AgeEvent(clock_.Now(), clock_.WallNow(), options_.sync->Committed(), uncommitted_));
      WriteStatus(last_status_event_);
    });
    ArmReportTimer();
  });
}

void Supervisor::ArmStallTimer() {
  if (exited_ || !SyncWrites()) return;
  auto next = durability_.NextCheck();
  if (!next) {
    stall_timer_.cancel();
    return;
  }
  auto wait = *next - clock_.Now();
  stall_timer_.expires_after(std::max<std::chrono::steady_clock::duration>(wait, {}));
  stall_timer_.async_wait([this](boost::system::error_code ec) {
    if (!ec && !exited_) OnStallCheck();
  });
}

void Supervisor::OnStallCheck() {
  // Not training (stopping, the final sync, done): the run's own end
  // handles the last sync.
  if (!Training(machine_.phase()) || !SyncWrites()) return;
  CountUncommitted([this] {
    if (!Training(machine_.phase()) || !SyncWrites()) return;
    auto e = durability_.Check(clock_.Now(), uncommitted_);
    if (!e) {
      ArmStallTimer();  // caught up meanwhile, or not due yet
      return;
    }
    if (durability_.level() == 2 && options_.config.sync_stall_stop) {
      e->message += "; sync-stall-action is stop: stopping the trainer and ending the run";
      e->fields["action"] = "stop";
    }
    logger_.Log(*e);
    WriteStatus(*e);
    if (durability_.level() == 2 && options_.config.sync_stall_stop) {
      // Between a crash and its restart there is no trainer to stop: the
      // restarted one is stopped as soon as it starts.
      if (machine_.phase() == Phase::kRunning) {
        Dispatch(SyncStalled{});
      } else {
        stall_stop_pending_ = true;
      }
    }
    ArmStallTimer();
  });
}

void Supervisor::ArmSyncTimer() {
  auto const& c = options_.config;
  if (!SyncWrites() || c.sync_interval.count() == 0) return;
  sync_timer_.expires_after(c.sync_interval);
  sync_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || exited_) return;
    StartSync("periodic", false, false);
    ArmSyncTimer();
  });
}

// Periodic and on-demand syncs are skipped while one is running; the others
// (final, restart, maintenance) queue behind it on the engine's lock. A
// final sync first cancels a periodic one in flight, so a sync asleep in
// Google's 32 s backoff cannot eat the Spot window.
void Supervisor::StartSync(const std::string& kind, bool final, bool write_done, const StartFinalSync* final_sync) {
  bool skippable = kind == "periodic" || kind == "on-demand";
  if (skippable && (sync_in_flight_ || !restored_)) {
    // Said once per sync in flight for the periodic timer (issue #32: one
    // line every sync-interval through a long upload); always on demand.
    if (kind != "periodic" || !restored_ || !skip_said_) {
      logger_.Info("sync.skipped", fmt::format("{} sync skipped: {}", kind,
                                               restored_ ? "a sync is already running (periodic syncs wait for it)"
                                                         : "not restored yet"));
      if (kind == "periodic" && restored_) skip_said_ = true;
    }
    return;
  }
  auto engine = options_.sync;
  if (auto fenced = engine->Fenced(); !fenced.empty()) {
    // Said once, as an ERROR, when it happened; from then on this VM only
    // notes that it does not sync.
    logger_.Info("sync.skipped",
                 fmt::format("{} sync skipped: another VM owns run-id \"{}\" (see sync.fenced)", kind,
                             output::EscapeInvalidUtf8(options_.config.run_id)),
                 {{"kind", kind}, {"reason", "fenced"}});
    if (final) asio::post(io_, [this] { Dispatch(SyncDone{false, true}); });
    if (kind == "restart") asio::post(io_, [this] { Dispatch(SyncDone{false, false}); });
    return;
  }
  CallContext ctx;
  ctx.clock = &clock_;
  ctx.cancel = NewWork();
  if (final) final_cancel_ = ctx.cancel;
  if (skippable) {
    sync_in_flight_ = true;
    skip_said_ = false;
    periodic_cancel_ = ctx.cancel;
    superseded_by_.clear();
  } else if (periodic_cancel_ && (final || kind == "preemption" || kind == "maintenance")) {
    periodic_cancel_->Cancel();
    superseded_by_ = kind;
  }
  if (final_sync) {
    // A little before the phase's own deadline, so the sync reports what
    // did not make it before the machine moves on.
    auto budget = final_sync->deadline - clock_.Now();
    auto slack = std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(1), budget / 10);
    ctx.deadline = final_sync->deadline - std::max<std::chrono::steady_clock::duration>(slack, {});
    ctx.urgent = final_sync->urgent;
  }
  int exit_code = machine_.exit_code();
  SyncKind mode = SyncKind::kPeriodic;
  // Before a restart, or after the trainer stopped, nothing is still being
  // written. A trainer that exited 0 (done, or saved on SIGINT and left) is
  // taken as it is; one that exited on its own with an error is taken as it
  // is unless the marker shows a save cut off; one that died of a signal
  // (Python's unhandled KeyboardInterrupt, the ladder's SIGTERM or SIGKILL,
  // the OOM killer) may have been cut off mid-save, so only the saves that
  // show they are whole are taken (sync/completeness.h). An exit code of
  // 130 is a trainer that chose to exit: it finished what it was doing.
  if (final || kind == "restart") {
    mode = exit_code == 0                     ? SyncKind::kCompleted
           : machine_.trainer_signal() != 0 ? SyncKind::kKilled
                                            : SyncKind::kStopped;
  }
  SyncOutcome outcome{clock_.Now(), clock_.WallNow(), std::nullopt};
  durability_.SyncInFlight(outcome.started);
  transfer_kind_ = kind;
  // How the run ended, for `spotvisor runs` (status.json in the run's
  // directory), written after the final sync within its deadline.
  nlohmann::json ended;
  if (final && machine_.end_reason()) {
    ended = RunStatusJson({{"state", "ended"}, {"reason", EndReasonName(*machine_.end_reason())}, {"exit_code", exit_code}});
  }
  // gang-checkpoint = all: the final sync of a generation is this rank's
  // share of that generation's set.
  std::shared_ptr<ObjectStore> run = final && gang_generation_ ? options_.gang_run_store : nullptr;
  std::int64_t generation = gang_generation_ ? gang_generation_->number : 0;
  SetId set = gang_generation_ ? SetOf(*gang_generation_, options_.config.gang_size) : SetId{};
  int rank = gang_rank_, size = options_.config.gang_size;
  pool_.Post([this, engine, kind, final, write_done, exit_code, ctx, mode, outcome, ended, run, generation, set, rank,
              size]() mutable {
    auto r = engine->Sync(mode, ctx);
    Status done;
    if (run) {
      bool whole = r.ok() && !r->deferred && r->not_uploaded.empty();
      Status shared = whole ? PrepareShare(*run, rank, set, ctx)
                            : FailedPreconditionError(r.ok() ? "the final sync did not commit the trainer's last save"
                                                             : r.status().message());
      std::optional<SetId> complete;
      if (shared.ok()) {
        auto newest = NewestCompleteSet(*run, size, ctx);
        if (newest.ok()) complete = *newest;
        if (complete && *complete == set) (void)DropOlderShares(*run, rank, set, ctx);
      }
      bool set_done = complete && *complete == set;
      // DONE once the completing generation's set is whole: whichever rank
      // sees that first writes it (done_once), the others find it there.
      bool already = false;
      if (write_done) done = set_done ? engine->WriteDone(exit_code, ctx, &already) : OkStatus();
      asio::post(io_, [this, shared, set_done, generation, rank, size, write_done, already] {
        done_left_to_gang_ = write_done && (!set_done || already);
        nlohmann::json f = {{"generation", generation}, {"rank", rank}, {"set_complete", set_done}};
        if (!shared.ok()) {
          f["error"] = shared.message();
          logger_.Warn("gang.share_failed",
                       fmt::format("rank {}'s share of generation {}'s checkpoint set is not committed ({}): that set will "
                                   "never be restored, the gang resumes from the previous complete one",
                                   rank, generation, shared.message()),
                       f);
        } else {
          logger_.Info("gang.share_committed",
                       set_done ? fmt::format("rank {} committed its share of generation {}'s checkpoint set: the set is "
                                              "complete ({} of {} ranks)",
                                              rank, generation, size, size)
                                : fmt::format("rank {} committed its share of generation {}'s checkpoint set; the set "
                                              "counts once every rank's is in",
                                              rank, generation),
                       f);
        }
      });
    } else {
      if (r.ok() && !r->deferred && write_done) done = engine->WriteDone(exit_code, ctx);
      if (r.ok() && r->deferred && write_done) done = FailedPreconditionError("nothing was committed");
    }
    // Informational: only after a sync that worked (the bucket answers), and
    // never holding on-exit up for long.
    if (!ended.is_null() && r.ok()) engine->PublishRunStatus(ended, ctx.WithDeadline(clock_.Now() + std::chrono::seconds(10)));
    // What is still at risk, for sync.complete and status (a scan, no I/O
    // to the bucket). Not after the final sync: nothing will read it.
    if (!final) {
      if (r.ok() && r->uncommitted) {
        outcome.uncommitted = *r->uncommitted;  // the sync's own scan: no second pass over the tree
      } else if (auto u = engine->Uncommitted(); u.ok()) {
        outcome.uncommitted = *u;
      }
    }
    asio::post(io_, [this, kind, final, r = std::move(r), done, outcome] { OnSyncDone(kind, final, r, done, outcome); });
  });
}

std::chrono::milliseconds Supervisor::FinalFlushBudget() const {
  std::chrono::milliseconds budget = SystemGoingDown() ? std::chrono::seconds(3) : std::chrono::seconds(10);
  if (auto end = machine_.WindowEnd(clock_.Now())) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*end - std::chrono::milliseconds(500) - clock_.Now());
    budget = std::clamp(left, std::chrono::milliseconds(0), budget);
  }
  return budget;
}

void Supervisor::ScheduleMemoryRelease() {
  memory_timer_.expires_after(kMemoryReleaseDelay);
  memory_timer_.async_wait([this](boost::system::error_code ec) {
    // A sync still running keeps the buffers it holds; its end schedules again.
    if (!ec && !sync_in_flight_) ReleaseFreeMemory();
  });
}

void Supervisor::OnSyncDone(const std::string& kind, bool final, const StatusOr<SyncStats>& r, const Status& done,
                            const SyncOutcome& outcome) {
  ScheduleMemoryRelease();
  if (kind == "periodic" || kind == "on-demand") {
    sync_in_flight_ = false;
    periodic_cancel_.reset();
  }
  durability_.SyncInFlight(std::nullopt);
  transfer_ = nullptr;
  if (final) {
    // What the boot record says was not committed when the run ended here.
    if (r.ok() && !r->deferred && r->not_uploaded.empty() && r->left_out.empty()) {
      uncommitted_ = UncommittedView{};
    } else if (r.ok() && r->uncommitted) {
      uncommitted_ = *r->uncommitted;
    } else {
      uncommitted_.reset();  // unknown: the final sync failed
    }
  }
  if (outcome.uncommitted) {
    uncommitted_ = outcome.uncommitted;
    uncommitted_as_of_ = clock_.WallNow();
  }
  bool committed = r.ok() && !r->deferred;
  if (committed) {
    // The bucket now holds the tree as of the sync's snapshot, no older than its start.
    if (auto e = durability_.CaughtUp(outcome.started, outcome.started_wall, clock_.Now())) logger_.Log(*e);
  } else if (r.ok()) {
    durability_.Problem(fmt::format("the last sync ({}) committed nothing: {}", kind, r->deferred_reason));
  } else {
    auto fenced = options_.sync->Fenced();
    durability_.Problem(!fenced.empty() ? fenced : fmt::format("the last sync ({}) failed: {}", kind, r.status().message()));
  }
  ArmStallTimer();
  auto committed_view = options_.sync->Committed();
  auto age = durability_.Json(clock_.Now(), clock_.WallNow(), committed_view, uncommitted_, uncommitted_as_of_);
  if (r.ok()) {
    for (auto const& name : r->skipped_names) {
      logger_.Warn("sync.unstorable_name",
                   fmt::format("not syncing \"{}\": {}; Cloud Storage cannot hold that name (rename the file to sync it)",
                               name, UnstorableReason(name).empty() ? "not valid UTF-8" : UnstorableReason(name)),
                   {{"path", name}});
    }
    if (!r->settle_warning.empty()) logger_.Warn("sync.settle_defeated", r->settle_warning, {{"kind", kind}});
    if (!r->not_staged.empty() && !not_staged_said_) {
      not_staged_said_ = true;  // once a run: it says how every later sync works on this disk
      logger_.Log(LogEvent{Severity::kNotice, "sync.not_staged", r->not_staged, {{"kind", kind}}});
    }
    if (!r->state_warning.empty()) logger_.Warn("sync.state_not_saved", r->state_warning);
  }
  if (committed) {
    double mbps = r->seconds > 0 ? static_cast<double>(r->bytes_uploaded) / 1e6 / r->seconds : 0;
    std::string how = r->judged_by.empty() ? "" : fmt::format(", complete by {}{}", r->judged_by, r->staged ? ", copied first" : "");
    std::string message =
        r->files_uploaded == 0 && r->files_deleted == 0 && r->sequence == 0
            ? fmt::format("{} sync: nothing to upload yet", kind)
        : r->files_uploaded == 0 && r->files_deleted == 0
            ? fmt::format("{} sync: nothing new since commit #{} ({} file(s))", kind, r->sequence, r->files_total)
            : fmt::format("{} sync #{}: {} file(s), {} in {:.2f}s ({}){}", kind, r->sequence,
                          r->files_uploaded == r->files_total ? fmt::format("{}", r->files_total)
                                                              : fmt::format("{} of {}", r->files_uploaded, r->files_total),
                          FormatBytes(r->bytes_uploaded), r->seconds, FormatRate(mbps * 1e6), how);
    logger_.Info("sync.complete", message,
                 {{"kind", kind}, {"sequence", r->sequence}, {"files", r->files_total}, {"files_uploaded", r->files_uploaded},
                  {"files_deferred", r->files_deferred}, {"files_deleted", r->files_deleted}, {"bytes", r->bytes_uploaded},
                  {"duration_s", r->seconds}, {"throughput_mbps", mbps}, {"attempts", r->attempts},
                  {"judged_by", r->judged_by}, {"staged", r->staged}, {"age_s", age["age_s"]}, {"left_out", r->left_out},
                  {"uncommitted_files", outcome.uncommitted ? nlohmann::json(outcome.uncommitted->files) : nlohmann::json(nullptr)},
                  {"uncommitted_bytes", outcome.uncommitted ? nlohmann::json(outcome.uncommitted->bytes) : nlohmann::json(nullptr)}});
    last_sync_ = {{"kind", kind}, {"ok", true}, {"sequence", r->sequence}, {"time", FormatRfc3339(clock_.WallNow())},
                  {"files_uploaded", r->files_uploaded}, {"bytes", r->bytes_uploaded}};
    if (!r->left_out.empty() && final) {
      std::string what;
      for (std::size_t i = 0; i < r->left_out.size(); ++i) what += (i ? "; " : "") + r->left_out[i];
      logger_.Log(LogEvent{Severity::kWarning, "sync.left_out",
                           fmt::format("{} sync #{} left out {} save(s) that were not whole, which keep their committed "
                                       "version (or stay out): {}",
                                       kind, r->sequence, r->left_out.size(), what),
                           {{"kind", kind}, {"sequence", r->sequence}, {"left_out", r->left_out}}});
    }
  } else if (r.ok()) {
    // Nothing committed: the tree was mid-save. Not a failure of the sync.
    Severity sev = final ? Severity::kWarning : Severity::kInfo;
    std::string message =
        final ? fmt::format("{} sync: the trainer's last save was not complete ({}); the bucket keeps commit #{}{}", kind,
                            r->deferred_reason, r->sequence,
                            r->not_uploaded.empty() ? "" : fmt::format(" ({} file(s) not uploaded)", r->not_uploaded.size()))
              : fmt::format("{} sync: not now, {}; the bucket keeps commit #{}", kind, r->deferred_reason, r->sequence);
    logger_.Log(LogEvent{sev, "sync.deferred", message,
                         {{"kind", kind}, {"sequence", r->sequence}, {"reason", r->deferred_reason},
                          {"files_deferred", r->files_deferred}, {"attempts", r->attempts}}});
    last_sync_ = {{"kind", kind}, {"ok", true}, {"deferred", true}, {"sequence", r->sequence},
                  {"reason", r->deferred_reason}, {"time", FormatRfc3339(clock_.WallNow())}};
  } else if (!final && r.status().code() == StatusCode::kCancelled) {
    // spotvisor cut it short itself: not a failure (issue #32: a periodic
    // sync cancelled by a preemption was an ERROR). What it uploaded is
    // reused by the sync that took over.
    logger_.Info("sync.superseded",
                 superseded_by_.empty()
                     ? fmt::format("{} sync cut short: spotvisor is stopping", kind)
                     : fmt::format("{} sync cut short: the {} sync takes over (what it uploaded is reused)", kind,
                                   superseded_by_),
                 {{"kind", kind}, {"by", superseded_by_}});
    last_sync_ = {{"kind", kind}, {"ok", false}, {"superseded", true}, {"time", FormatRfc3339(clock_.WallNow())}};
  } else {
    auto fenced = options_.sync->Fenced();
    if (!fenced.empty() && !fence_logged_) {
      fence_logged_ = true;
      logger_.Error("sync.fenced", fenced, {{"kind", kind}, {"run_id", options_.config.run_id}});
    } else {
      logger_.Error("sync.failed", fmt::format("{} sync failed: {}", kind, r.status().message()),
                    {{"kind", kind}, {"error", r.status().message()}});
    }
    last_sync_ = {{"kind", kind}, {"ok", false}, {"error", r.status().message()}, {"time", FormatRfc3339(clock_.WallNow())}};
  }
  if (committed && !done.ok()) logger_.Error("done.failed", "could not write the DONE marker: " + done.message());
  if (committed && done.ok() && final && done_left_to_gang_) {
    logger_.Info("done.left_to_gang", "DONE is written once, by the rank whose share completes the gang's last checkpoint set "
                                      "(or whichever saw it complete first)");
  } else if (committed && done.ok() && final && machine_.phase() == Phase::kSyncing &&
             machine_.end_reason() == EndReason::kCompleted) {
    logger_.Info("done.written", options_.sync->Describe() + "/DONE written: a VM booting with this run-id will not train again");
  }
  if (final) {
    // A final sync that found the last save cut off committed nothing, and
    // says so above; the previous commit stands, which is what it is for.
    Dispatch(SyncDone{r.ok() && done.ok(), true});  // the machine's transition writes status.json
    return;
  }
  // `spotvisor sync` waits for last_sync to change in status.json.
  if (machine_.phase() != Phase::kDone) {
    WriteStatus(LogEvent{Severity::kInfo, committed ? "sync.complete" : r.ok() ? "sync.deferred" : "sync.failed",
                         last_sync_.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), {}});
  }
  if (kind == "restart") Dispatch(SyncDone{r.ok(), false});
}

void Supervisor::OnSignal(int signo) {
  signals_.async_wait([this](auto ec, int s) {
    if (!ec) OnSignal(s);
  });
  if (signo == SIGCHLD) {
    Reap();
  } else if (signo == SIGUSR2) {
    // `spotvisor release`
    if (machine_.phase() == Phase::kHolding) {
      Dispatch(Release{});
    } else {
      logger_.Info("signal.received", "SIGUSR2 (release): nothing is being held");
    }
  } else if (signo == SIGUSR1) {
    if (SyncWrites()) {
      StartSync("on-demand", false, false);
    } else if (options_.sync) {
      logger_.Warn("sync.skipped", fmt::format("SIGUSR1: this gang member (rank {}) does not sync: rank 0 syncs the "
                                               "gang's checkpoints (gang-checkpoint = leader)", gang_rank_));
    } else {
      logger_.Warn("sync.skipped", "SIGUSR1: no bucket is configured, nothing to sync");
    }
  } else if (signo == SIGQUIT) {
    // "Stop now": a stop request and its repetition, so the ladder skips
    // the grace a first request gives.
    Dispatch(StopSignal{signo});
    Dispatch(StopSignal{signo});
  } else {
    Dispatch(StopSignal{signo});  // SIGINT, SIGTERM, SIGHUP
  }
}

// waitpid(-1) until nothing is left to collect: as a subreaper we also
// inherit every orphaned grandchild, and each must be reaped.
void Supervisor::Reap() {
  options_.children->ReapAll([this](pid_t pid, int status) {
    if (pid == trainer_pid_) {
      trainer_reaped_ = true;
      NoteTrainerRunning(false);
      for (auto& p : pumps_) p->DrainNow(OutputPump::kReadsAtExit);
      Dispatch(TrainerExited{pid, WIFEXITED(status) ? WEXITSTATUS(status) : 0,
                             WIFSIGNALED(status) ? WTERMSIG(status) : 0,
                             static_cast<int>(ListProcessGroup(trainer_pid_).size())});
    } else if (pid == on_exit_pid_) {
      on_exit_pid_ = 0;
      Dispatch(OnExitDone{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)});
    }
  });
  CheckLeftoversGone();
}

void Supervisor::CheckLeftoversGone() {
  if (machine_.phase() == Phase::kStopping && machine_.leader_exited() && ListProcessGroup(trainer_pid_).empty()) {
    Dispatch(GroupEmpty{});
  }
  if (machine_.phase() != Phase::kDraining) return;
  // No children but our own helpers (the FUSE daemon), so nothing the trainer
  // started survives.
  for (pid_t p : ListChildren()) {
    if (!IsOurHelper(p)) return;
  }
  Dispatch(LeftoversGone{});
}

bool Supervisor::IsOurHelper(pid_t pid) const {
  return options_.mounts && pid > 0 && pid == options_.mounts->fuse_pid();
}

void Supervisor::SignalLeftovers(int signo) {
  std::vector<pid_t> pids;
  for (pid_t p : ListChildren()) {
    if (p != on_exit_pid_ && !IsOurHelper(p)) pids.push_back(p);
  }
  if (!pids.empty()) {
    logger_.Warn("trainer.leftovers",
                 fmt::format("{} process(es) left behind by the trainer: sending {}", pids.size(), strsignal(signo)),
                 {{"pids", pids}, {"signal", signo}});
    if (trainer_pid_ > 0) killpg(trainer_pid_, signo);
    for (pid_t p : pids) kill(p, signo);
  }
  // Re-check after the signals, via the loop, so a leftover that already
  // died is reaped first.
  asio::post(io_, [this] { Reap(); });
}

void Supervisor::RunPoweroff() {
  auto const& cmd = options_.config.shutdown_command;
  logger_.Log(LogEvent{Severity::kNotice, "shutdown.start", fmt::format("on-exit poweroff: running `{}`", cmd),
                       {{"command", cmd}, {"action", "poweroff"}}});
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", cmd};
  o.env = options_.base_env;
  o.capture_output = true;
  auto spawned = Spawn(o);
  if (!spawned.ok()) {
    logger_.Error("shutdown.failed", spawned.status().message());
    asio::post(io_, [this] { Dispatch(OnExitDone{127}); });
    return;
  }
  on_exit_pid_ = spawned->pid;
  pumps_.push_back(std::make_unique<OutputPump>(io_, spawned->stdout_fd, "stdout", "shutdown.output", logger_, clock_,
                                                options_.config.progress_interval));
  pumps_.push_back(std::make_unique<OutputPump>(io_, spawned->stderr_fd, "stderr", "shutdown.output", logger_, clock_,
                                                options_.config.progress_interval));
  for (auto& p : pumps_) p->Start();
}

void Supervisor::Exit(int code) {
  DropSshTrust();
  exit_code_ = code;
  exited_ = true;
  for (auto& p : pumps_) p->Close();
  boost::system::error_code ec;
  signals_.cancel(ec);
  deadline_timer_.cancel();
  sync_timer_.cancel();
  idle_timer_.cancel();
  watchdog_timer_.cancel();
  report_timer_.cancel();
  stall_timer_.cancel();
  memory_timer_.cancel();
  stop_check_timer_.cancel();
  if (auto by = machine_.RecordsDeadline(clock_.Now())) {
    for (auto& o : observers_) o->FinishBy(*by);
  }
  for (auto& o : observers_) o->Close();
  compute_sleeper_.Cancel();
  io_.stop();
}

void Supervisor::OnMachineEvent(LogEvent e) {
  if (e.event == "supervisor.state") phase_since_ = clock_.WallNow();
  logger_.Log(e);
  last_machine_event_ = std::move(e);
}

RunView Supervisor::View(const LogEvent& last) const {
  RunView v;
  v.run_id = options_.config.run_id;
  v.mode = options_.mode;
  v.phase = PhaseName(machine_.phase());
  v.state = StateName(machine_.state());
  v.since = phase_since_;
  if (trainer_pid_ > 0 && !trainer_reaped_) v.trainer_pid = trainer_pid_;
  if (auto r = machine_.end_reason()) v.reason = EndReasonName(*r);
  if (machine_.phase() == Phase::kDone) v.exit_code = machine_.exit_code();
  v.deadline = machine_.deadline();
  v.ending = machine_.Ending();
  if (options_.sync) v.bucket = options_.sync->Describe();
  if (options_.group) v.group = options_.group->Path();
  v.last_event = last.event;
  v.last_message = last.message;
  v.last_sync = last_sync_;
  v.transfer = transfer_;
  if (options_.gang) v.gang = options_.gang->StatusJson();
  if (options_.sync && restored_) {
    v.checkpoint = durability_.Json(clock_.Now(), clock_.WallNow(), options_.sync->Committed(), uncommitted_,
                                    uncommitted_as_of_);
  }
  v.spotvisor_pid = getpid();
  v.start_time_ticks = start_time_ticks_;
  v.boot_id = boot_id_;
  return v;
}

// Every observer hears of every change, after the event's actions: nothing
// may delay a signal to the trainer.
void Supervisor::WriteStatus(const LogEvent& last) {
  last_status_event_ = last;
  auto view = View(last);
  for (auto& o : observers_) o->OnChange(view);
}

}  // namespace spotvisor
