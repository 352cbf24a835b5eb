// Drives the StateMachine on one io_context: signals (SIGINT, SIGTERM,
// SIGCHLD) arrive through asio::signal_set, the trainer's output through
// stream descriptors, metadata changes are posted in from the watcher
// threads, and one steady_timer guards the machine's current deadline.
#pragma once

#include <sys/types.h>

#include "common/asio.h"
#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "config/config.h"
#include "log/logger.h"
#include "output/line_assembler.h"
#include "process/spawn.h"
#include "supervisor/durability.h"
#include "supervisor/observers.h"
#include "supervisor/state_machine.h"
#include "activity/activity.h"
#include "compute/compute_client.h"
#include "metadata/guest_attributes.h"
#include "sync/sync_engine.h"
#include "sync/checkpoint_set.h"
#include "run/boots.h"
#include "run/budget.h"
#include "compute/group.h"
#include "run/claim.h"
#include "notify/service_notifier.h"
#include "mount/mount_manager.h"
#include "process/children.h"
#include "common/cancel.h"
#include "common/worker_pool.h"
#include "retry/sleeper.h"
#include "gang/session.h"
#include "gang/ssh_trust.h"

namespace spotvisor {

struct SupervisorOptions {
  Config config;
  std::optional<UserInfo> user;  // set when the trainer runs as another user
  std::vector<std::string> base_env;  // environment the trainer starts from
  bool already_preempted = false;
  bool maintenance_terminate = false;
  // instance/scheduling/on-host-maintenance at boot: MIGRATE means a
  // maintenance does not stop the VM ("" unknown: assume it does).
  std::string on_host_maintenance;
  std::string instance;  // this VM's name (status.json in the bucket)
  std::string mode;  // "daemon" or "run", for the status file
  std::shared_ptr<SyncEngine> sync;  // null when no bucket is configured
  // gang-checkpoint = all (sync/checkpoint_set.h): the run's root in the
  // bucket and this member's rank store; null otherwise.
  std::shared_ptr<ObjectStore> gang_run_store;
  std::shared_ptr<RankStore> gang_rank_store;
  // This VM's claim on the run (run/claim.h) and its boot record
  // (run/boots.h); null without a bucket.
  std::shared_ptr<RunClaim> claim;
  std::shared_ptr<BootRecord> boot;
  // The budget of failed boots in a row (run/budget.h); null without a bucket.
  std::shared_ptr<RunBudget> budget;
  // The group that brings this VM back (compute/group.h; issue #30): an
  // ending that should stop the billing leaves it; a failed boot within the
  // budget deletes the VM for the group to recreate. nullopt: in no group.
  std::optional<InstanceGroup> group;
  std::function<std::unique_ptr<GroupClient>(Sleeper&)> make_group;
  // on-exit stop | delete; null without a metadata server (then: poweroff).
  std::function<std::unique_ptr<ComputeClient>(Sleeper&)> make_compute;
  std::string compute_api = "the Compute Engine API";  // or "the EC2 API", for messages
  // The same state as status.json, as guest attributes; null without metadata.
  std::shared_ptr<GuestAttributesWriter> guest_attributes;
  // EC2: the phase as the instance tag spotvisor-phase; null elsewhere.
  std::shared_ptr<GuestAttributesWriter> instance_tags;
  // systemd's notify socket (Type=notify); null when not under systemd.
  std::shared_ptr<ServiceNotifier> notifier;
  // Every child spawned off the loop (mkfs, the FUSE daemon) is registered
  // here; the supervisor reaps through it. Never null.
  std::shared_ptr<ChildRegistry> children = std::make_shared<ChildRegistry>();
  // Null when nothing is to be mounted.
  std::shared_ptr<MountManager> mounts;
  // Gang training (issue #16); null: no gang.
  std::shared_ptr<GangSession> gang;
};

class Supervisor {
 public:
  // `signals` must include SIGINT, SIGTERM and SIGCHLD; it is owned by the
  // caller so that it can be installed before configuration is loaded.
  Supervisor(boost::asio::io_context& io, const Clock& clock, Logger& logger, SupervisorOptions options,
             boost::asio::signal_set& signals);
  ~Supervisor();

  // Starts the run; the exit code is known once io.run() returns.
  void Start();
  int exit_code() const { return exit_code_; }
  // The machine is going down under us (preempted, or systemd stopping us):
  // the last log delivery gets seconds, not the usual budget.
  bool SystemGoingDown() const {
    return machine_.stopped_by_signal() || machine_.preempted();
  }
  // How long the last log lines may take to deliver at exit: 10 s; 3 s when
  // the system is going down; after a preemption never past half a second
  // before the machine is taken (an EC2 notice seen late leaves less).
  std::chrono::milliseconds FinalFlushBudget() const;

  // Thread-safe: called from the metadata watcher threads. `ends_at`: when
  // the cloud takes the machine, if the notice says (EC2); `what` names the
  // notice in the log.
  void NotifyPreempted(std::optional<WallTime> ends_at = std::nullopt, std::string what = "");
  // An early warning that the machine may be taken (EC2's rebalance
  // recommendation): sync now, keep training.
  void NotifyRebalance(const std::string& body);
  // An Auto Scaling group is terminating this instance (its target lifecycle
  // state became Terminated: scale-in, capacity rebalancing): as a
  // preemption two minutes ahead, and once the final sync is over, the
  // lifecycle action is completed (GroupClient::CompleteTermination), so a
  // hook holding the instance in Terminating:Wait lets it go at once.
  void NotifyGroupTerminating(const std::string& state);
  void NotifyMaintenance(const std::string& value);
  // instance/upcoming-maintenance's answer ("" for nothing scheduled).
  void NotifyUpcomingMaintenance(const std::string& body);

 private:
  class OutputPump;

  void Dispatch(const Event& e);
  void Execute(const Action& a);
  void ArmDeadline();
  void OnSignal(int signo);
  void Reap();
  void SpawnTrainer(bool resumed, int restart_count);
  void SignalLeftovers(int signo);
  // Children that are not the trainer's: the FUSE daemon.
  bool IsOurHelper(pid_t pid) const;
  void RunOnExit();
  void RunPoweroff();
  void LeaveGroup(bool retry);
  void ArmStopCheck();
  void CheckBudgetAtEnd(const CallContext& ctx);
  void AbandonOnExit();
  void ForcePoweroff();
  OnExit OnExitFor(EndReason reason) const;
  void Exit(int code);
  void OnMachineEvent(LogEvent e);
  // Tells every observer (status.json, guest attributes, systemd).
  void WriteStatus(const LogEvent& last);
  RunView View(const LogEvent& last) const;
  // WATCHDOG=1 from the loop itself (READY=1 is sent at the start).
  void ArmWatchdog(std::chrono::microseconds interval);
  void CheckLeftoversGone();
  // Restore and sync block on the network: they run on threads of their own
  // and post their result back to the loop.
  void StartRestore();
  void NoteTrainerRunning(bool running);
  void StartMounts();
  void StartUnmounts();
  // `final_sync`: the deadline and urgency of a final sync (else none).
  void StartSync(const std::string& kind, bool final, bool write_done, const StartFinalSync* final_sync = nullptr);
  void ArmSyncTimer();
  void ArmIdleTimer();
  // `started`: when the sync began (its snapshot is no older); `uncommitted`:
  // counted right after it.
  struct SyncOutcome {
    SteadyTime started{};
    WallTime started_wall{};
    std::optional<UncommittedView> uncommitted;
  };
  void OnSyncDone(const std::string& kind, bool final, const StatusOr<SyncStats>& r, const Status& done,
                  const SyncOutcome& outcome);
  // Durability (issue #14): the periodic `checkpoint.age` report and the
  // stall check, each counting what is not committed off the loop first.
  void ArmReportTimer();
  void ArmStallTimer();
  void CountUncommitted(std::function<void()> then);
  void OnStallCheck();

  boost::asio::io_context& io_;
  const Clock& clock_;
  Logger& logger_;
  SupervisorOptions options_;
  StateMachine machine_;
  boost::asio::signal_set& signals_;
  boost::asio::steady_timer deadline_timer_;
  boost::asio::steady_timer sync_timer_;
  boost::asio::steady_timer idle_timer_;
  boost::asio::steady_timer watchdog_timer_;
  boost::asio::steady_timer report_timer_;
  boost::asio::steady_timer stall_timer_;
  // Gives the transfer buffers back once no sync has ended for
  // kMemoryReleaseDelay (common/memory.h): syncs close together reuse
  // them, an idle daemon holds none.
  boost::asio::steady_timer memory_timer_;
  bool not_staged_said_ = false;  // sync.not_staged, once a run
  static constexpr std::chrono::seconds kMemoryReleaseDelay{10};
  void ScheduleMemoryRelease();
  boost::asio::steady_timer claim_timer_;
  boost::asio::steady_timer stop_check_timer_;  // RUN_ID/STOP (`spotvisor stop`), every stop-check-interval
  std::atomic<bool> claim_released_{false};
  bool boot_begun_ = false;  // the boot record was begun (StartRestore, once)
  // The failed boots in a row before this one (run/budget.h), read at the
  // restore; set when this boot's failure used up the budget (FAILED written).
  std::vector<std::string> failed_before_;
  bool budget_exhausted_ = false;
  bool complete_lifecycle_ = false;
  bool stop_check_failing_ = false;  // NotifyGroupTerminating: complete the hook's action at the end
  // Renews this VM's claim on the run every third of its lifetime (run/claim.h).
  void ArmClaimTimer();
  void RenewClaim(const std::string& state);
  void ReleaseClaim(const CallContext& ctx);
  DurabilityTracker durability_;
  std::optional<UncommittedView> uncommitted_;
  std::optional<WallTime> uncommitted_as_of_;
  void OnUpcomingMaintenance(const std::string& body);
  // status.json in the run's directory, for `spotvisor runs`.
  nlohmann::json RunStatusJson(nlohmann::json fields) const;
  void PublishRunStatus(nlohmann::json fields);
  bool maintenance_known_ = false;  // a maintenance.scheduled is in force
  bool stall_stop_pending_ = false;  // sync-stall-action = stop came while the trainer was restarting
  // Callers waiting for the count of what is not committed (one scan in flight at a time).
  std::vector<std::function<void()>> count_waiters_;
  LogEvent last_status_event_;  // what status.json's last_event says
  std::vector<std::unique_ptr<RunObserver>> observers_;
  std::unique_ptr<ActivitySampler> sampler_;
  std::optional<IdleDetector> idle_;
  // Every piece of blocking work in flight has a cancel source here; a stop
  // (or the destructor) cancels them.
  std::shared_ptr<CancelSource> NewWork();
  void CancelAllWork();
  std::vector<std::weak_ptr<CancelSource>> work_;
  std::shared_ptr<CancelSource> restore_cancel_, final_cancel_, compute_cancel_;
  bool sync_in_flight_ = false;       // periodic or on-demand
  // Cancels the periodic/on-demand sync in flight (asleep in backoff, say)
  // when the final sync must start now.
  std::shared_ptr<CancelSource> periodic_cancel_;
  std::string superseded_by_;
  bool skip_said_ = false;  // sync.skipped said for the periodic sync in flight  // the kind of sync that cancelled the periodic one in flight
  bool fence_logged_ = false;
  bool restored_ = false;
  nlohmann::json last_sync_;
  // The sync or restore moving bytes now (SyncProgress, for status); null
  // when none. transfer_kind_: which one ("restore", "periodic", "final", ...).
  nlohmann::json transfer_;
  std::string transfer_kind_;
  void OnTransferProgress(const SyncProgress& p);
  // Gang (issue #16).
  void StartForming();
  void OnGangFormed(const Generation& g, int rank);
  // This member syncs checkpoints: a bucket, and not a gang member that
  // only restores (gang-checkpoint = leader, rank > 0).
  bool SyncWrites() const { return options_.sync && !gang_follower_; }
  // gang-checkpoint = all: this rank's final sync did not complete the set,
  // so another rank writes DONE.
  bool done_left_to_gang_ = false;
  std::string published_phase_;  // this member's phase as last given to the gang
  std::vector<std::string> GangEnv() const;
  // gang-launch = leader (gang/ssh_trust.h).
  bool LeaderMode() const;
  std::string SshTag(std::int64_t generation) const;
  std::string SshKeyDir() const;
  std::string SshKeyPath() const;
  void DropSshTrust();
  // Whose authorized_keys the leader's key goes into: the trainer user's
  // (its home replaced when gang-ssh-authorized-keys names another file).
  StatusOr<UserInfo> ssh_user_ = UserInfo{};
  std::optional<Generation> gang_generation_;
  int gang_rank_ = -1;
  bool gang_follower_ = false;
  CancellableSleeper compute_sleeper_;
  std::vector<std::unique_ptr<OutputPump>> pumps_;
  pid_t trainer_pid_ = 0;
  pid_t on_exit_pid_ = 0;
  bool trainer_reaped_ = false;
  bool exited_ = false;
  int exit_code_ = 0;
  WallTime phase_since_{};
  std::optional<LogEvent> last_machine_event_;  // written to status.json after the actions
  std::optional<std::uint64_t> start_time_ticks_;  // /proc/self/stat field 22, for status.json
  std::string boot_id_;
  // Last: destroyed first, after its tasks were cancelled and given a bound.
  WorkerPool pool_{6};
};

}  // namespace spotvisor
