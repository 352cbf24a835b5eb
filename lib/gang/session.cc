#include "gang/session.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/worker_pool.h"
#include "retry/backoff_policy.h"

namespace spotvisor {
namespace {

std::string Endpoints(const EtcdOptions& o) {
  std::string s;
  for (auto const& e : o.endpoints) s += (s.empty() ? "" : ", ") + e;
  return s;
}

bool Transient(const Status& s) {
  return s.code() == StatusCode::kUnavailable || s.code() == StatusCode::kDeadlineExceeded ||
         s.code() == StatusCode::kInternal;
}

}  // namespace

GangSession::GangSession(GangSessionOptions options, std::unique_ptr<EtcdClient> etcd, Logger& logger, const Clock& clock)
    : options_(std::move(options)), etcd_(std::move(etcd)), logger_(logger), clock_(clock) {
  options_.self.size = options_.gang.size;
  coordinator_ = std::make_unique<GangCoordinator>(*etcd_, options_.gang, options_.self, clock_, sleeper_);
  coordinator_->SetPhaseHook([this](const std::string& instance, const std::string& phase) {
    std::function<void()> notify;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = phases_.find(instance);
      std::string before = it == phases_.end() ? "" : it->second;
      if (before == phase) return;
      if (phase.empty()) {
        phases_.erase(instance);
      } else {
        phases_[instance] = phase;
      }
      notify = peers_changed_;
    }
    if (notify) notify();
  });
}

namespace {
constexpr std::chrono::milliseconds kPhaseDelay{250};
}  // namespace

void GangSession::OnPeersChanged(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  peers_changed_ = std::move(fn);
}

void GangSession::PublishPhase(std::string phase) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    phases_[options_.self.instance] = phase;
    phase_pending_ = std::move(phase);
    if (phase_publishing_ || !joined_) return;  // the task in flight takes the newest; Join publishes it
    phase_publishing_ = true;
  }
  RunTask([this](const CallContext& ctx) {
    for (;;) {
      // A moment's delay, so a burst of changes (stopping, draining,
      // syncing) is one write, and none competes with the etcd writes on
      // the paths that matter (the end of a generation, forming): the
      // benchmark's stop-together p99 went from 13 to ~50 ms without it.
      if (ctx.cancel && !ctx.cancel->WaitFor(kPhaseDelay)) {
        std::lock_guard<std::mutex> lock(mu_);
        phase_publishing_ = false;
        return;
      }
      std::string next;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!phase_pending_ || !joined_) {
          phase_publishing_ = false;
          return;
        }
        next = *std::move(phase_pending_);
        phase_pending_.reset();
      }
      // Informational: a failure (etcd away) is not worth more than the
      // etcd_unavailable the keep-alive already logs.
      auto bounded = ctx.WithDeadline(clock_.Now() + std::chrono::seconds(10));
      (void)coordinator_->PublishPhase(next, bounded);
    }
  });
}

GangSession::~GangSession() { Stop(std::chrono::seconds(2)); }

CallContext GangSession::Ctx(const std::shared_ptr<CancelSource>& cancel) const {
  CallContext c;
  c.cancel = cancel;
  c.clock = &clock_;
  return c;
}

void GangSession::Start(Callbacks cb) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    generation_.reset();
    rank_ = -1;
  }
  // Forming again (gang-on-loss = wait): the last generation's watch has
  // returned (it reported the end) and this member has left.
  if (forming_.joinable()) forming_.join();
  cb_ = std::move(cb);
  logger_.Info("gang.joining",
               fmt::format("joining gang {} ({} members) through etcd at {} as {} ({})", options_.gang.name,
                           options_.gang.size, Endpoints(options_.etcd), options_.self.instance, options_.self.ip),
               {{"gang", options_.gang.name}, {"size", options_.gang.size}, {"instance", options_.self.instance},
                {"ip", options_.self.ip}, {"etcd", options_.etcd.endpoints}});
  forming_ = StartSignalFreeThread([this] { RunForming(); });
}

void GangSession::NoteEtcd(const Status& s, const char* doing) {
  std::lock_guard<std::mutex> lock(mu_);
  if (s.ok()) {
    if (etcd_down_) {
      logger_.Info("gang.etcd_recovered", fmt::format("etcd answered again after {} failed attempt(s)", etcd_failures_),
                   {{"failed_attempts", etcd_failures_}});
    }
    etcd_down_ = false;
    etcd_failures_ = 0;
    return;
  }
  ++etcd_failures_;
  if (etcd_down_) return;
  etcd_down_ = true;
  logger_.Warn("gang.etcd_unavailable",
               fmt::format("{}: {}; retrying with backoff (the trainer, if running, keeps running)", doing, s.message()),
               {{"error", s.message()}});
}

bool GangSession::JoinWithRetry() {
  auto ctx = Ctx(stop_);
  ExponentialBackoffPolicy backoff(std::chrono::milliseconds(250), std::chrono::seconds(5), 2.0);
  std::optional<SteadyTime> name_taken_since;
  for (;;) {
    auto s = coordinator_->Join(ctx);
    if (s.ok()) {
      NoteEtcd(OkStatus(), "");
      std::optional<std::string> phase;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!joined_) {
          logger_.Info("gang.joined",
                       fmt::format("registered in gang {}; waiting for {} members", options_.gang.name, options_.gang.size),
                       {{"gang", options_.gang.name}, {"size", options_.gang.size}});
        }
        joined_ = true;
        // The phase set before there was a lease to publish it under.
        auto self = phases_.find(options_.self.instance);
        if (self != phases_.end()) phase = self->second;
      }
      if (phase) PublishPhase(*phase);
      return true;
    }
    if (ctx.cancelled()) return false;
    if (s.code() == StatusCode::kFailedPrecondition) {
      // The name is held by another boot: a VM recreated (or rebooted) before
      // its old lease expired looks just like this. Wait for two TTLs; a
      // holder still there then is a second machine with the same name.
      auto now = clock_.Now();
      if (!name_taken_since) {
        name_taken_since = now;
        logger_.Warn("gang.name_taken",
                     fmt::format("{}; waiting up to {}s for that lease to expire", s.message(),
                                 2 * options_.gang.member_ttl.count()),
                     {{"error", s.message()}});
      }
      if (now - *name_taken_since < 2 * options_.gang.member_ttl) {
        if (!ctx.SleepFor(std::chrono::milliseconds(500))) return false;
        continue;
      }
    }
    if (!Transient(s) && s.code() != StatusCode::kNotFound) {
      logger_.Error("gang.form_failed", s.message(), {{"error", s.message()}});
      if (cb_.failed) cb_.failed(s);
      return false;
    }
    NoteEtcd(s, "registering in the gang");
    if (!ctx.SleepFor(backoff.OnCompletion())) return false;
  }
}

void GangSession::RunForming() {
  if (!JoinWithRetry()) return;
  if (!keepalive_.joinable()) keepalive_ = StartSignalFreeThread([this] { RunKeepAlive(); });
  auto ctx = Ctx(stop_);
  Generation g;
  ExponentialBackoffPolicy backoff(std::chrono::milliseconds(250), std::chrono::seconds(5), 2.0);
  for (;;) {
    auto got = coordinator_->AwaitGeneration(ctx);
    if (got.ok()) {
      g = *std::move(got);
      break;
    }
    if (ctx.cancelled()) return;
    if (got.status().code() == StatusCode::kNotFound) {
      // Our lease expired while we waited (etcd away for longer than the TTL).
      if (!JoinWithRetry()) return;
      continue;
    }
    if (got.status().code() == StatusCode::kFailedPrecondition || got.status().code() == StatusCode::kInvalidArgument) {
      logger_.Error("gang.form_failed", got.status().message(), {{"error", got.status().message()}});
      if (cb_.failed) cb_.failed(got.status());
      return;
    }
    NoteEtcd(got.status(), "waiting for the gang to form");
    if (!ctx.SleepFor(backoff.OnCompletion())) return;
  }
  int rank = -1;
  nlohmann::json members = nlohmann::json::array();
  for (auto const& m : g.members) {
    if (m.instance == options_.self.instance) rank = m.rank;
    members.push_back({{"instance", m.instance}, {"ip", m.ip}, {"rank", m.rank}});
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_ = g;
    rank_ = rank;
  }
  logger_.Log(LogEvent{Severity::kNotice, "gang.formed",
                       fmt::format("gang {} generation {} formed: this VM is rank {} of {} (rank 0: {} at {})",
                                   options_.gang.name, g.number, rank, g.members.size(),
                                   g.members.empty() ? "" : g.members[0].instance, g.members.empty() ? "" : g.members[0].ip),
                       {{"gang", options_.gang.name}, {"generation", g.number}, {"rank", rank},
                        {"size", g.members.size()}, {"members", members}}});
  if (cb_.formed) cb_.formed(g, rank);
  for (;;) {
    auto end = coordinator_->AwaitEndRecord(g, ctx);
    if (end.ok()) {
      nlohmann::json fields = {{"gang", options_.gang.name}, {"generation", g.number}, {"reason", end->reason}};
      if (end->failed) fields["member_failed"] = true;
      logger_.Warn("gang.ended", fmt::format("gang {} generation {} ended: {}", options_.gang.name, g.number, end->reason),
                   std::move(fields));
      // Out of the gang until this member is ready again: a new generation
      // (gang-on-loss = wait) forms only once every member has joined again,
      // so rank 0's final sync is over by then.
      LeaveNow(std::chrono::seconds(2));
      if (cb_.ended) cb_.ended(g.number, *end);
      return;
    }
    if (ctx.cancelled()) return;
    NoteEtcd(end.status(), "watching the gang");
    if (!ctx.SleepFor(backoff.OnCompletion())) return;
  }
}

void GangSession::RunKeepAlive() {
  auto every = std::max(std::chrono::milliseconds(500),
                        std::chrono::duration_cast<std::chrono::milliseconds>(options_.gang.member_ttl) / 3);
  bool lost_logged = false;
  auto ctx = Ctx(stop_);
  while (ctx.SleepFor(every)) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!joined_) continue;  // left on purpose (the generation ended); renewed again once joined
    }
    auto call = ctx.WithDeadline(clock_.Now() + every);
    auto r = coordinator_->KeepAlive(call);
    if (ctx.cancelled()) return;
    if (r.ok()) {
      NoteEtcd(OkStatus(), "");
      lost_logged = false;
      continue;
    }
    if (r.code() == StatusCode::kNotFound) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!joined_) continue;  // revoked by LeaveNow meanwhile, on purpose
      }
      if (!lost_logged) {
        logger_.Error("gang.lease_lost",
                      fmt::format("this VM's gang lease expired (not renewed for {}s): the others count it as gone",
                                  options_.gang.member_ttl.count()),
                      {{"error", r.message()}});
      }
      lost_logged = true;
      continue;
    }
    NoteEtcd(r, "renewing the gang lease");
  }
}

void GangSession::RunTask(std::function<void(const CallContext&)> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return;
  auto ctx = Ctx(tasks_cancel_);
  // A long run publishes many phases: threads that are done are joined here,
  // not kept (each would hold its stack) until Stop.
  std::erase_if(tasks_, [](Task& t) {
    if (!t.finished->load()) return false;
    t.thread.join();
    return true;
  });
  auto finished = std::make_shared<std::atomic<bool>>(false);
  tasks_.push_back(Task{StartSignalFreeThread([fn = std::move(fn), ctx, finished] {
                          fn(ctx);
                          finished->store(true);
                        }),
                        finished});
}

void GangSession::End(std::int64_t generation, std::string reason, bool failed) {
  logger_.Warn("gang.ending", fmt::format("ending gang {} generation {}: {}", options_.gang.name, generation, reason),
               {{"gang", options_.gang.name}, {"generation", generation}, {"reason", reason}});
  RunTask([this, generation, reason, failed](const CallContext& ctx) {
    auto r = coordinator_->EndGeneration(generation, reason, ctx, failed);
    if (!r.ok()) {
      logger_.Error("gang.end_failed", fmt::format("could not record the end of generation {}: {}", generation, r.status().message()),
                    {{"generation", generation}, {"error", r.status().message()}});
    } else if (*r != reason) {
      logger_.Info("gang.end_taken", fmt::format("generation {} had already ended: {}", generation, *r),
                   {{"generation", generation}, {"reason", *r}});
    }
  });
}

void GangSession::Done(std::int64_t generation) {
  std::optional<Generation> g;
  {
    std::lock_guard<std::mutex> lock(mu_);
    g = generation_;
  }
  if (!g || g->number != generation) return;
  logger_.Info("gang.done", fmt::format("this VM's trainer finished generation {}'s work; waiting for the other members'",
                                        generation),
               {{"generation", generation}});
  RunTask([this, g = *g](const CallContext& ctx) {
    auto r = coordinator_->MarkDone(g, ctx);
    if (!r.ok()) {
      logger_.Error("gang.done_failed", fmt::format("could not record that this VM's trainer finished: {}", r.status().message()),
                    {{"generation", g.number}, {"error", r.status().message()}});
    }
  });
}

void GangSession::Stop(std::chrono::milliseconds bound) {
  std::vector<std::thread> tasks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    for (auto& t : tasks_) tasks.push_back(std::move(t.thread));
    tasks_.clear();
  }
  auto start = clock_.Now();
  stop_->Cancel();
  sleeper_.Cancel();
  if (forming_.joinable()) forming_.join();
  if (keepalive_.joinable()) keepalive_.join();
  // End and Done say something the others must hear: they get half the
  // bound before they are cut short.
  std::thread cutter = StartSignalFreeThread([this, bound] {
    if (tasks_cancel_->WaitFor(bound / 2)) tasks_cancel_->Cancel();
  });
  for (auto& t : tasks) t.join();
  tasks_cancel_->Cancel();
  cutter.join();
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(start + bound - clock_.Now());
  LeaveNow(std::max(left, std::chrono::milliseconds(200)));
}

void GangSession::LeaveNow(std::chrono::milliseconds bound) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!joined_) return;
    joined_ = false;
  }
  CallContext c;
  c.clock = &clock_;
  c.deadline = clock_.Now() + bound;
  auto s = coordinator_->Leave(c);
  if (s.ok()) {
    logger_.Info("gang.left", fmt::format("left gang {} (lease revoked)", options_.gang.name));
  } else if (s.code() != StatusCode::kNotFound) {
    logger_.Warn("gang.leave_failed",
                 fmt::format("could not leave gang {}: {}; the others see this VM gone when its lease expires ({}s)",
                             options_.gang.name, s.message(), options_.gang.member_ttl.count()),
                 {{"error", s.message()}});
  }
}

Status GangSession::SetUpSshTrust(const Generation& g, int rank, const std::function<StatusOr<std::string>()>& make_key,
                                  const std::function<Status(const std::string& key_line)>& authorize,
                                  const CallContext& ctx) {
  // The caller's cancellation and Stop() both end the waits.
  auto cancel = std::make_shared<CancelSource>();
  auto by_stop = stop_->Subscribe([cancel] { cancel->Cancel(); });
  std::uint64_t by_caller = 0;
  if (ctx.cancel) by_caller = ctx.cancel->Subscribe([cancel] { cancel->Cancel(); });
  CallContext c = ctx;
  c.cancel = cancel;
  if (!c.clock) c.clock = &clock_;
  Status s;
  if (rank == 0) {
    auto key = make_key();
    s = !key.ok() ? key.status() : coordinator_->PublishSshKey(g, *key, c);
    if (s.ok()) s = coordinator_->AwaitSshReady(g, c);
  } else {
    auto key = coordinator_->AwaitSshKey(g, c);
    s = !key.ok() ? key.status() : authorize(*key);
    if (s.ok()) s = coordinator_->MarkSshReady(g, c);
  }
  stop_->Unsubscribe(by_stop);
  if (ctx.cancel) ctx.cancel->Unsubscribe(by_caller);
  return s;
}

nlohmann::json GangSession::StatusJson() const {
  std::lock_guard<std::mutex> lock(mu_);
  nlohmann::json j = {{"name", options_.gang.name}, {"size", options_.gang.size}, {"instance", options_.self.instance},
                      {"ip", options_.self.ip}, {"etcd_reachable", !etcd_down_}};
  if (generation_) {
    j["generation"] = generation_->number;
    j["rank"] = rank_;
    nlohmann::json members = nlohmann::json::array();
    for (auto const& m : generation_->members) {
      auto p = phases_.find(m.instance);
      members.push_back({{"instance", m.instance}, {"ip", m.ip}, {"rank", m.rank},
                         {"phase", p == phases_.end() ? nlohmann::json(nullptr) : nlohmann::json(p->second)}});
    }
    j["members"] = members;
  }
  return j;
}

}  // namespace spotvisor
