// The end of a run on this VM, and the run's record in the bucket while it
// lasts (Supervisor, continued): on-exit, leaving a group, the budget of
// failed boots, the power-off of last resort; the claim, the run status and
// the stop request (`spotvisor stop`).
#include "supervisor/supervisor.h"

#include <sys/reboot.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "common/json_fields.h"
#include "output/utf8.h"

namespace spotvisor {

namespace asio = boost::asio;

nlohmann::json Supervisor::RunStatusJson(nlohmann::json fields) const {
  fields["run_id"] = options_.config.run_id;
  fields["time"] = FormatRfc3339(clock_.WallNow());
  if (!options_.instance.empty()) fields["instance"] = options_.instance;
  if (options_.group) fields["group"] = options_.group->Path();
  return fields;
}

void Supervisor::PublishRunStatus(nlohmann::json fields) {
  // In a gang, rank 0 writes it (before forming, nobody: the rank is not known).
  if (!options_.sync || (options_.gang && gang_rank_ != 0)) return;
  auto engine = options_.sync;
  auto status = RunStatusJson(std::move(fields));
  CallContext ctx;
  ctx.clock = &clock_;
  ctx.cancel = NewWork();
  ctx.deadline = clock_.Now() + std::chrono::seconds(60);
  pool_.Post([this, engine, status, ctx] {
    auto s = engine->PublishRunStatus(status, ctx);
    if (s.ok() || s.code() == StatusCode::kFailedPrecondition) return;  // fenced: said elsewhere
    asio::post(io_, [this, s] {
      logger_.Warn("run.status_not_published",
                   fmt::format("could not write {}/{} (what `spotvisor runs` shows; the run goes on): {}",
                               options_.sync->Describe(), kRunStatus, s.message()));
    });
  });
}

void Supervisor::ArmClaimTimer() {
  if (!options_.claim || exited_ || claim_released_) return;
  claim_timer_.expires_after(options_.claim->ttl() / 3);
  claim_timer_.async_wait([this](boost::system::error_code ec) {
    if (ec || exited_ || claim_released_) return;
    RenewClaim(PhaseName(machine_.phase()));
    ArmClaimTimer();
  });
}

// `spotvisor stop` from a laptop writes RUN_ID/STOP; every VM of the run
// looks for it every stop-check-interval while the trainer may run.
void Supervisor::ArmStopCheck() {
  auto budget = options_.budget;
  auto every = options_.config.stop_check_interval;
  if (!budget || every.count() <= 0 || exited_) return;
  stop_check_timer_.expires_after(every);
  stop_check_timer_.async_wait([this, budget, every](boost::system::error_code ec) {
    if (ec || exited_) return;
    auto p = machine_.phase();
    if (p != Phase::kRunning && p != Phase::kRestarting && p != Phase::kForming) {
      if (p == Phase::kStarting || p == Phase::kRestoring || p == Phase::kMounting) ArmStopCheck();
      return;  // the run is ending anyway
    }
    CallContext ctx;
    ctx.clock = &clock_;
    ctx.cancel = NewWork();
    ctx.deadline = clock_.Now() + std::min<std::chrono::milliseconds>(every, std::chrono::seconds(30));
    pool_.Post([this, budget, ctx] {
      auto s = budget->ReadStopRequest(ctx);
      asio::post(io_, [this, s] {
        if (exited_) return;
        if (!s.ok()) {
          // Once per streak: the bucket being away is said by the syncs too.
          if (!stop_check_failing_) logger_.Warn("run.stop_check_failed", "cannot look for a stop request: " + s.status().message());
          stop_check_failing_ = true;
        } else if (*s) {
          Dispatch(StopRequested{JsonString(**s, "by")});
          return;
        } else {
          stop_check_failing_ = false;
        }
        ArmStopCheck();
      });
    });
  });
}

void Supervisor::RenewClaim(const std::string& state) {
  auto claim = options_.claim;
  CallContext ctx;
  ctx.clock = &clock_;
  ctx.cancel = NewWork();
  ctx.deadline = clock_.Now() + claim->ttl() / 3;
  pool_.Post([this, claim, ctx, state] {
    if (claim_released_) return;
    if (auto c = claim->Renew(state, ctx); !c.ok()) {
      asio::post(io_, [this, c] { logger_.Warn("run.claim_failed", c.message() + "; it is tried again at the next renewal"); });
    }
  });
}

void Supervisor::ReleaseClaim(const CallContext& ctx) {
  if (claim_released_.exchange(true)) return;
  (void)options_.claim->Release(ctx);  // if it fails, the claim expires by itself
}

OnExit Supervisor::OnExitFor(EndReason reason) const {
  auto const& c = options_.config;
  bool success = reason == EndReason::kCompleted || reason == EndReason::kAlreadyDone;
  // A trainer that succeeded but whose results never reached the bucket is
  // not a success: on-exit-success (delete, say) would destroy the only copy.
  bool failure = reason == EndReason::kFailed || reason == EndReason::kRestoreFailed || reason == EndReason::kMountFailed ||
                 reason == EndReason::kSyncStalled || reason == EndReason::kSyncFailed || reason == EndReason::kRunFailed;
  if (success && c.on_exit_success) return *c.on_exit_success;
  if (failure && c.on_exit_failure) return *c.on_exit_failure;
  return c.on_exit;
}

void Supervisor::RunOnExit() {
  // The last lines say why the VM stops: deliver them before it does.
  logger_.Flush(std::chrono::seconds(10));
  EndReason reason = *machine_.end_reason();
  OnExit action = OnExitFor(reason);
  if (action == OnExit::kNone) {
    logger_.Info("shutdown.skipped", fmt::format("on-exit is none after a {} run: leaving the machine running", EndReasonName(reason)));
    asio::post(io_, [this] { Dispatch(OnExitDone{0}); });
    return;
  }
  if (options_.group && options_.make_group && reason == EndReason::kMaintenance) {
    // The host maintenance stops or terminates the VM; its group brings it
    // back, as after a preemption. Leaving would end the run for good.
    logger_.Info("shutdown.skipped", fmt::format("a host maintenance ends this boot: left to {}, which brings the VM back",
                                                 options_.group->Describe()));
    asio::post(io_, [this] { Dispatch(OnExitDone{0}); });
    return;
  }
  if (options_.group && options_.make_group) {
    // In a group, stopping or deleting the VM (or powering it off) would be
    // undone by the group. A failed boot within the budget is deleted for
    // the group to recreate (another try on a fresh VM); every other ending
    // leaves the group. Without a bucket there is no budget: no retries.
    bool failure = JudgeBootEnd(EndReasonName(reason)) == BootVerdict::kFailure;
    LeaveGroup(failure && options_.budget && !budget_exhausted_);
    return;
  }
  if (action == OnExit::kPoweroff) {
    RunPoweroff();
    return;
  }
  const char* verb = action == OnExit::kStop ? "stop" : "delete";
  if (!options_.make_compute) {
    logger_.Error("shutdown.api_failed",
                  fmt::format("on-exit {} needs the metadata server (project, zone, token), which is not there: powering off instead", verb));
    RunPoweroff();
    return;
  }
  logger_.Log(LogEvent{Severity::kNotice, "shutdown.start", fmt::format("on-exit {}: asking {} to {} this VM", verb, options_.compute_api, verb),
                       {{"action", verb}}});
  CallContext ctx;
  ctx.cancel = compute_cancel_ = NewWork();
  ctx.clock = &clock_;
  ctx.deadline = machine_.deadline();  // half the on-exit budget
  pool_.Post([this, action, verb, ctx] {
    auto client = options_.make_compute(compute_sleeper_);
    Status s = action == OnExit::kStop ? client->StopInstance(ctx) : client->DeleteInstance(ctx);
    asio::post(io_, [this, s, verb] {
      if (machine_.phase() != Phase::kFinishing) return;  // abandoned meanwhile
      if (s.ok()) {
        logger_.Info("shutdown.api_done", fmt::format("{} accepted the {}; the cloud takes it from here", options_.compute_api, verb));
        Dispatch(OnExitDone{0});
        return;
      }
      // The machine powers off instead (never leave the VM running by accident).
      logger_.Error("shutdown.api_failed", fmt::format("on-exit {} failed: {}; powering off instead", verb, s.message()),
                    {{"error", s.message()}});
      Dispatch(OnExitDone{1});
    });
  });
}

void Supervisor::LeaveGroup(bool retry) {
  auto const& g = *options_.group;
  CallContext ctx;
  ctx.cancel = compute_cancel_ = NewWork();
  ctx.clock = &clock_;
  ctx.deadline = machine_.deadline();  // half the on-exit budget
  nlohmann::json f = {{"group", g.Path()}, {"group_kind", g.KindName()}};
  if (retry) {
    if (!options_.make_compute) {
      logger_.Error("group.retry_failed", fmt::format("cannot delete this VM for {} to recreate it (no metadata server): "
                                                      "powering off instead",
                                                      g.Describe()));
      RunPoweroff();
      return;
    }
    f["action"] = "retry";
    logger_.Log(LogEvent{Severity::kNotice, "shutdown.start",
                         fmt::format("failed boot {} of {} in a row: asking {} to delete this VM, so that {} recreates "
                                     "it for another try",
                                     failed_before_.size() + 1, options_.budget->max() > 0 ? std::to_string(options_.budget->max()) : "unlimited",
                                     options_.compute_api, g.Describe()),
                         f});
  }
  std::shared_ptr<GroupClient> client;
  if (!retry) {
    client = options_.make_group(compute_sleeper_);
    if (!client) {
      logger_.Error("shutdown.api_failed", fmt::format("cannot leave {}: this instance's region is not known; powering "
                                                       "off instead",
                                                       g.Describe()));
      RunPoweroff();
      return;
    }
    f["action"] = "leave";
    logger_.Log(LogEvent{Severity::kNotice, "shutdown.start",
                         fmt::format("leaving {}: {} on this VM, so that the group's size goes down and nothing "
                                     "replaces it",
                                     g.Describe(), client->LeaveCall()),
                         f});
  }
  bool clean_up = !retry && options_.config.group_delete_when_empty;
  pool_.Post([this, retry, ctx, client, clean_up] {
    std::vector<std::string> deleted;
    std::string skipped;
    Status s = retry      ? options_.make_compute(compute_sleeper_)->DeleteInstance(ctx)
               : clean_up ? client->LeaveAndCleanUp(ctx, &deleted, &skipped)
                          : client->Leave(ctx);
    if (!skipped.empty()) {
      asio::post(io_, [this, skipped] {
        logger_.Warn("group.cleanup_skipped",
                     fmt::format("group-delete-when-empty: the group is not deleted ({}); what is left stays",
                                 skipped),
                     {{"error", skipped}});
      });
    }
    if (!deleted.empty()) {
      asio::post(io_, [this, deleted] {
        logger_.Info("group.deleted",
                     fmt::format("the group was empty after this VM: deleted {}", fmt::join(deleted, ", ")),
                     {{"deleted", deleted}});
      });
    }
    asio::post(io_, [this, s, retry] {
      if (machine_.phase() != Phase::kFinishing) return;  // abandoned meanwhile
      auto const& group = *options_.group;
      if (s.ok()) {
        logger_.Info("shutdown.api_done", retry ? fmt::format("the delete was accepted; {} brings a new VM", group.Describe())
                                                : fmt::format("{} accepted: this VM is leaving it", group.Describe()));
        Dispatch(OnExitDone{0});
        return;
      }
      // Never a self-delete the group would undo: power off instead. A
      // group that is not there any more brings nothing back: said so.
      bool gone = !retry && s.code() == StatusCode::kNotFound;
      logger_.Error("shutdown.api_failed",
                    gone ? fmt::format("leaving the group failed: {}. {} does not hold this VM any more (deleted, "
                                       "this VM taken out of it, or the {} names another group), so nothing brings "
                                       "this VM back: powering off instead",
                                       s.message(), group.Describe(), group.source)
                         : fmt::format("{} failed: {}; powering off instead", retry ? "deleting this VM" : "leaving the group",
                                       s.message()),
                    {{"error", s.message()}, {"group", group.Path()}, {"group_gone", gone}});
      Dispatch(OnExitDone{1});
    });
  });
}

// The end of a boot that failed: one more failed boot in a row. When that
// uses up max-failed-boots, RUN_ID/FAILED is written (the caller's 3 s) and
// this boot leaves its group instead of being recreated.
void Supervisor::CheckBudgetAtEnd(const CallContext& ctx) {
  auto const& budget = options_.budget;
  if (!budget || !machine_.end_reason()) return;
  std::string reason = EndReasonName(*machine_.end_reason());
  if (JudgeBootEnd(reason) != BootVerdict::kFailure) return;
  auto failed = failed_before_;
  failed.push_back(options_.boot ? options_.boot->name() : options_.instance);
  int n = static_cast<int>(failed.size());
  nlohmann::json f = {{"failed_in_a_row", n}, {"max_failed_boots", budget->max()}};
  if (budget->max() == 0 || n < budget->max()) {
    logger_.Warn("run.failed_boot",
                 fmt::format("failed boot {} in a row{} ({}): {}", n,
                             budget->max() > 0 ? fmt::format(" of max-failed-boots {}", budget->max()) : "", reason,
                             options_.group ? "the group brings a new VM for another try" : "a later boot tries again"),
                 f);
    return;
  }
  bool already = false;
  auto s = budget->MarkFailed(failed, options_.instance, reason, ctx, &already);
  budget_exhausted_ = true;
  if (!s.ok()) {
    logger_.Error("run.mark_failed_failed",
                  fmt::format("{} failed boots in a row, but {}; this boot still {}", n, s.message(),
                              options_.group ? "leaves its group" : "runs on-exit"),
                  f);
    return;
  }
  f["marker"] = budget->MarkerName();
  logger_.Log(LogEvent{Severity::kError, "run.marked_failed",
                       fmt::format("{} failed boots in a row (max-failed-boots {}): {} {}; later boots of this run end "
                                   "at once{}",
                                   n, budget->max(), budget->MarkerName(), already ? "was already there" : "written",
                                   options_.group ? ", and this VM leaves its group" : ""),
                       f});
}

// The on-exit action hung or failed: cancel the API call, kill the command
// (its exit is no longer reported).
void Supervisor::AbandonOnExit() {
  if (compute_cancel_) compute_cancel_->Cancel();
  if (on_exit_pid_ > 0) {
    kill(on_exit_pid_, SIGKILL);
    on_exit_pid_ = 0;
  }
}

// The last resort when nothing else powered the VM off. Only as the
// systemd service on the VM (`spotvisor daemon` with systemd's
// INVOCATION_ID): `spotvisor run`, or a daemon started by hand on someone's
// machine, never halts it by force.
void Supervisor::ForcePoweroff() {
  const char* invocation = std::getenv("INVOCATION_ID");
  if (options_.mode != "daemon" || invocation == nullptr || *invocation == '\0') {
    logger_.Error("shutdown.not_forced",
                  "not powering the machine off by force: that is only done by spotvisor daemon running as the systemd "
                  "service; the machine keeps running");
    return;
  }
  logger_.Flush(std::chrono::seconds(2));
  ::sync();
  if (reboot(RB_POWER_OFF) != 0) {
    logger_.Error("shutdown.not_forced", fmt::format("reboot(RB_POWER_OFF) failed: {}", std::strerror(errno)));
  }
}

}  // namespace spotvisor
