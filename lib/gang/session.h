// The daemon's side of a gang (issue #16, docs/gang.md): joins through the
// GangCoordinator, waits for a generation with this member in it, keeps the
// member's lease alive and watches for the generation's end, each on a
// thread of its own, and tells the supervisor through callbacks (called on
// those threads: the supervisor posts them to its loop). Every etcd call
// carries a deadline or is cut short by Stop().
//
// etcd being unreachable is waited out with backoff, logged once per streak
// (`gang.etcd_unavailable`, then `gang.etcd_recovered`); the state
// machine's `gang-form-timeout` bounds the wait while forming, and while
// training nothing stops the trainer but a member that is really gone (its
// lease expired: see gang.h on split brain).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "gang/etcd_client.h"
#include "gang/gang.h"
#include "log/logger.h"
#include "retry/sleeper.h"

namespace spotvisor {

struct GangSessionOptions {
  EtcdOptions etcd;
  GangOptions gang;
  GangMember self;
};

class GangSession {
 public:
  struct Callbacks {
    // A generation with this member in it is in force.
    std::function<void(const Generation&, int rank)> formed;
    // Forming cannot succeed: the members disagree, the instance name is
    // held by another machine, or etcd holds records that cannot be read.
    // Not called for etcd being away (that is retried).
    std::function<void(const Status&)> failed;
    // The generation this member is in has ended, and why (reason: "member
    // X is gone", kGangCompleted, or the reason a member gave; failed: that
    // member's own trainer failed).
    std::function<void(std::int64_t generation, const GenerationEnd& end)> ended;
  };

  GangSession(GangSessionOptions options, std::unique_ptr<EtcdClient> etcd, Logger& logger, const Clock& clock);
  ~GangSession();

  // Join, wait for a generation, then watch for its end.
  void Start(Callbacks cb);
  // Ends `generation` for everyone with `reason` (logged as `gang.ending`),
  // off the caller's thread.
  // `failed`: this member's own trainer failed (GenerationEnd::failed).
  void End(std::int64_t generation, std::string reason, bool failed = false);
  // This member's trainer finished its work: recorded; the generation ends
  // as completed when every member's has (gang.h, MarkDone).
  void Done(std::int64_t generation);
  // Cuts every wait short, lets End/Done calls in flight finish within
  // half of `bound`, then revokes the lease (the member key goes) within
  // the rest. Idempotent.
  void Stop(std::chrono::milliseconds bound);
  // For status.json and guest attributes: name, size, instance, and once
  // formed, generation, rank and members.
  nlohmann::json StatusJson() const;
  // This member's phase (`running`, `stopping`, ...) for the others'
  // `spotvisor status`: published off the caller's thread, the latest wins.
  void PublishPhase(std::string phase);
  // Called (from a session thread) when another member's phase changed.
  void OnPeersChanged(std::function<void()> fn);
  // gang-launch = leader: sets up generation g's ssh trust on the caller's
  // thread, within ctx and cut short by Stop. Rank 0 runs make_key (which
  // returns its public key line), publishes it and waits until every other
  // member is ready; the others wait for the key, run authorize with it and
  // say they are ready. kFailedPrecondition when g ends meanwhile.
  Status SetUpSshTrust(const Generation& g, int rank, const std::function<StatusOr<std::string>()>& make_key,
                       const std::function<Status(const std::string& key_line)>& authorize, const CallContext& ctx);
  const GangSessionOptions& options() const { return options_; }

 private:
  void RunForming();
  void RunKeepAlive();
  // Joins, retrying while etcd is away. False when stopped or refused
  // (then `failed` has been called).
  bool JoinWithRetry();
  void NoteEtcd(const Status& s, const char* doing);
  void RunTask(std::function<void(const CallContext&)> fn);
  // Revokes the lease (the member key goes) within `bound`, once per Join.
  void LeaveNow(std::chrono::milliseconds bound);
  CallContext Ctx(const std::shared_ptr<CancelSource>& cancel) const;

  GangSessionOptions options_;
  std::unique_ptr<EtcdClient> etcd_;
  Logger& logger_;
  const Clock& clock_;
  CancellableSleeper sleeper_;
  std::unique_ptr<GangCoordinator> coordinator_;
  Callbacks cb_;
  std::shared_ptr<CancelSource> stop_ = std::make_shared<CancelSource>();   // forming, watching, keep-alive
  std::shared_ptr<CancelSource> tasks_cancel_ = std::make_shared<CancelSource>();  // End, Done
  std::thread forming_, keepalive_;
  mutable std::mutex mu_;  // guards what follows
  struct Task {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> finished;
  };
  std::vector<Task> tasks_;  // finished ones are joined when the next starts
  std::optional<Generation> generation_;
  int rank_ = -1;
  std::map<std::string, std::string> phases_;  // others' phases, by instance
  std::optional<std::string> phase_pending_;    // this member's, not yet published
  bool phase_publishing_ = false;
  std::function<void()> peers_changed_;
  bool joined_ = false;
  bool etcd_down_ = false;  // a streak of failures is being waited out (logged once)
  int etcd_failures_ = 0;
  bool stopped_ = false;
};

}  // namespace spotvisor
