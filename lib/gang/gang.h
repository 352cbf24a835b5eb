// The gang coordinator (issue #16, second block): N machines form a gang
// through etcd, get ranks, start together, and stop together when one of
// them has trouble. There is no controller: every member runs the same code
// and the rules below make them agree.
//
// Keys, all under PREFIX = "/spotvisor/gang/" NAME "/":
// - PREFIX "members/" INSTANCE: the member, as JSON {"instance","ip","zone",
//   "gpus","size","command_hash","boot_id"}, Put under the member's own lease
//   (TTL member_ttl; the caller renews it with KeepAlive every TTL/3). A
//   machine that vanishes without a word is gone when its lease expires.
//   Registration is a Txn "create_revision == 0": a second machine with the
//   same instance name is refused, named, unless the key it finds carries the
//   same boot_id (a spotvisor restarted on the same boot registers again).
// - PREFIX "generation": {"generation":N,"formed_at":RFC3339,"members":
//   [{"instance","ip","rank","registered"}...]} in rank order ("registered":
//   the create_revision of the member's key at commit). Committed by ONE Txn that
//   compares the generation key's mod_revision with the one read
//   (create_revision == 0 when there was none) AND every chosen member's key
//   with the mod_revision read: nobody can commit over a generation or a
//   member list that changed meanwhile. Any member may try, exactly one
//   wins, the others re-read and adopt the winner's.
// - PREFIX "end/" N: {"by","reason","at","failed"} ends generation N for
//   everyone ("failed": the ending member's own trainer failed).
//   Put with "create_revision == 0": the first reason wins, later ones are
//   no-ops that return the winner's reason. End records are not leased: a
//   generation stays ended.
//
// A generation is in force while it has no end record and each of its
// members is live: key present, not created anew since the commit, same IP.
// A member whose key disappears (lease expired, Leave) ends the generation:
// whoever notices first writes the end record "member X is gone", so every
// member reports the same reason. A spotvisor restarted on the same boot
// takes its key over without recreating it, so it finds itself in the
// generation in force and gets it back from AwaitGeneration: if its trainer
// did not survive the restart, the caller ends the generation.
//
// Split brain: a member's lease is its only claim to be alive. While etcd
// itself is down nobody can expire or end anything (and etcd renews every
// lease when it comes back), so trainers keep running; a member cut off from
// etcd alone loses its lease after member_ttl and the others end the
// generation: a member that cannot reach etcd cannot take part in the next
// agreement either, so for the gang it is gone.
//
// Ranks (AssignRanks, a pure function): an instance of the previous
// generation keeps its rank while it is live; the free ranks go to the other
// live members in order of (IPv4 address as a number, then non-IPv4
// addresses as strings, then instance name). With no previous generation
// that puts the lowest private IP at rank 0 (seed 004: it runs mpiexec).
// Only `size` members are chosen; the rest are standbys: not in the
// generation, they wait and fill a gap at the next formation. Ranks are
// stable across re-formations, so per-rank checkpoint shards keep their owner,
// and follow the instance name, not the IP (a member that comes back with a
// new IP keeps its rank; the generation lists its new IP).
//
// Refusal to form: when live members disagree on the gang size or the
// command hash, no generation is committed and AwaitGeneration returns
// kFailedPrecondition naming both members and both values.
//
// Everything read from etcd was written by other machines, possibly another
// version or a broken one: it is parsed with checks into Status, never
// trusted, never thrown on.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "gang/etcd_client.h"
#include "retry/sleeper.h"

namespace spotvisor {

struct GangMember {
  std::string instance, ip, zone, boot_id, command_hash;
  // What the members must agree on besides size and command (issue #28): two
  // runs under one gang name must never train together. Empty: not said (a
  // member of an older version), not compared.
  std::string run_id, bucket, checkpoint, launch;
  int gpus = 0;
  int size = 0;
  friend bool operator==(const GangMember&, const GangMember&) = default;
};

struct RankedMember {
  std::string instance, ip;
  int rank = 0;
  // The create_revision of the member's key when the generation was
  // committed (0: not recorded). A key created anew since then means the
  // member was gone in between, even if nobody saw it go.
  std::int64_t registered = 0;
  friend bool operator==(const RankedMember&, const RankedMember&) = default;
};

struct Generation {
  std::int64_t number = 0;
  std::string formed_at;
  std::vector<RankedMember> members;  // rank order: members[i].rank == i
  // Minted with the generation (16 hex digits): names its checkpoint set
  // (gang-checkpoint = all) so that no later etcd, counting generations from
  // 1 again, can name another set the same. "": an older version's record.
  std::string set_id;
  friend bool operator==(const Generation&, const Generation&) = default;
};

struct GenerationEnd {
  std::string by, reason, at;
  // The member that ended it did so because its own trainer failed (issue
  // #28): a survivor whose trainer failed too, on the lost connection, is
  // then not looking at a lost member. Absent in older records: false.
  bool failed = false;
};

// The members chosen from `live` for a gang of `size`, in rank order (see
// the header comment for the rule). With fewer than `size` live members the
// result is the ranks that could be given, possibly with gaps; the
// coordinator only commits a full set.
std::vector<RankedMember> AssignRanks(const std::vector<GangMember>& live, int size,
                                      const std::optional<Generation>& previous);

// OkStatus when every live member agrees with `self` on size and command
// hash; else kFailedPrecondition naming both sides.
Status CheckAgreement(const std::string& gang, const GangMember& self, const std::vector<GangMember>& live);

// The JSON values of the keys above, and their checked parsers.
std::string MemberJson(const GangMember& m);
StatusOr<GangMember> ParseMember(std::string_view json);
std::string GenerationJson(const Generation& g);
StatusOr<Generation> ParseGeneration(std::string_view json);
std::string EndJson(const GenerationEnd& e);
StatusOr<GenerationEnd> ParseEnd(std::string_view json);

// The end reason of a generation whose members' trainers all exited 0.
inline constexpr char kGangCompleted[] = "completed: every member's trainer exited 0";

struct GangOptions {
  std::string name;
  int size = 0;
  std::chrono::seconds member_ttl{10};
  // How long one watch stays open before it is renewed: the gateway's
  // stream has no heartbeat, so a silently vanished etcd is noticed then.
  std::chrono::milliseconds watch_window{60000};
  // gang-launch = leader: the work is rank 0's command, so a generation is
  // complete when rank 0's trainer finished (the others only host it).
  bool leader_completes = false;
};

// "/spotvisor/gang/NAME/".
std::string GangPrefix(const std::string& name);

class GangCoordinator {
 public:
  // self.size is taken from options.size.
  GangCoordinator(EtcdClient& etcd, GangOptions options, GangMember self, const Clock& clock, Sleeper& sleeper);

  // KeepAlive may run on its own thread alongside the other calls; the
  // others are meant for one thread.
  //
  // Grants a lease and registers this member under it. kFailedPrecondition
  // when another machine holds the instance name.
  Status Join(const CallContext& ctx);
  // Renews the lease. kNotFound when it expired (the member key is gone and
  // any generation with this member has ended): Join again.
  Status KeepAlive(const CallContext& ctx);
  // Blocks until a generation that includes this member is in force: adopts
  // one, or commits one itself when `size` agreeing members are live and no
  // generation is in force. A standby keeps waiting. Watches, does not poll.
  // kNotFound when this member is not registered (Join first);
  // kFailedPrecondition when the members disagree or a member key holds no
  // member (see above); kInternal when the generation record is unreadable
  // (the message says to delete it). etcd being away is waited out, within ctx.
  StatusOr<Generation> AwaitGeneration(const CallContext& ctx);
  // Ends generation n for everyone; returns the reason that won. A member
  // that is going away (preempted) should Leave once its part is done, so
  // that the next formation does not count on it.
  // `failed`: this member's trainer failed (recorded; see GenerationEnd).
  StatusOr<std::string> EndGeneration(std::int64_t n, const std::string& reason, const CallContext& ctx,
                                      bool failed = false);
  // Blocks until generation g ends and returns why: its end record's reason,
  // "member X is gone" (which it also records as the end), or "generation N
  // was replaced by M". Watches, does not poll.
  StatusOr<std::string> AwaitEnd(const Generation& g, const CallContext& ctx);
  // The same, with the whole record: who ended it and whether its trainer
  // failed ("by" empty and failed false when nobody ended it: a member
  // gone, a generation replaced).
  StatusOr<GenerationEnd> AwaitEndRecord(const Generation& g, const CallContext& ctx);
  // Records that this member's trainer finished generation g's work (exit
  // 0) under PREFIX "done/" N "/" INSTANCE (not leased; safe to repeat).
  // When every member of g has, ends g with kGangCompleted. Returns the
  // reason g ended with if it has ended (by this call or before), else "".
  StatusOr<std::string> MarkDone(const Generation& g, const CallContext& ctx);
  // gang-launch = leader: the ssh trust of generation g, under PREFIX
  // "ssh/" N. Rank 0 publishes its public key (leased: it goes with rank 0);
  // every other member waits for it, authorizes it and says it is ready
  // (leased); rank 0 waits until all have. Each Await returns kFailedPrecondition when
  // g ends first, and honours ctx (the forming deadline).
  Status PublishSshKey(const Generation& g, const std::string& key_line, const CallContext& ctx);
  // Every member's phase, for `spotvisor status` on any member: this
  // member's under PREFIX "phase/" INSTANCE (leased: it goes with the
  // member). Others' reach `hook` from the reads and watches this
  // coordinator does anyway (nothing extra is polled); "" = gone.
  Status PublishPhase(const std::string& phase, const CallContext& ctx);
  void SetPhaseHook(std::function<void(const std::string& instance, const std::string& phase)> hook);
  StatusOr<std::string> AwaitSshKey(const Generation& g, const CallContext& ctx);
  Status MarkSshReady(const Generation& g, const CallContext& ctx);
  Status AwaitSshReady(const Generation& g, const CallContext& ctx);
  // Revokes the lease: the member key goes, and with it any generation it is in.
  Status Leave(const CallContext& ctx);

  const std::string& prefix() const { return prefix_; }

 private:
  struct Snapshot;
  StatusOr<Snapshot> Read(const CallContext& ctx);
  // One watch of the prefix from revision + 1, for at most watch_window:
  // true when `stop` said so for a batch of events (or history was
  // compacted: read afresh), false when the window or ctx ended.
  StatusOr<bool> WatchOnce(std::int64_t revision, const std::function<bool(const std::vector<EtcdEvent>&)>& stop,
                           const CallContext& ctx);
  // Waits until something under the prefix changes after `revision`.
  Status WaitForChange(std::int64_t revision, const CallContext& ctx);
  // Reads [key, range_end) until `enough` says so; kFailedPrecondition when generation
  // n has ended meanwhile.
  StatusOr<std::vector<EtcdKv>> AwaitKeys(std::int64_t n, const std::string& key, const std::string& range_end,
                                          const std::function<bool(const std::vector<EtcdKv>&)>& enough,
                                          const std::string& what, const CallContext& ctx);
  Status PutLeased(const std::string& key, const std::string& value, const std::string& what, const CallContext& ctx);
  std::string SshKey(std::int64_t n) const { return prefix_ + "ssh/" + std::to_string(n) + "/key"; }
  void NotePhase(const EtcdKv& kv, bool deleted);
  std::function<void(const std::string&, const std::string&)> phase_hook_;  // set before the threads start
  std::string SshReadyDir(std::int64_t n) const { return prefix_ + "ssh/" + std::to_string(n) + "/ready/"; }
  StatusOr<std::optional<Generation>> TryCommit(const Snapshot& s, const std::vector<RankedMember>& chosen,
                                                const CallContext& ctx);
  Status Backoff(const Status& why, int attempt, const CallContext& ctx);
  std::string MemberKey(const std::string& instance) const { return prefix_ + "members/" + instance; }
  std::string EndKey(std::int64_t n) const { return prefix_ + "end/" + std::to_string(n); }

  EtcdClient& etcd_;
  const GangOptions options_;
  const GangMember self_;
  const std::string prefix_;
  const Clock& clock_;
  Sleeper& sleeper_;
  std::atomic<std::int64_t> lease_{0};
};

}  // namespace spotvisor
