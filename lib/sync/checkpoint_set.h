// gang-checkpoint = all (issue #16): every rank of a gang syncs its own
// checkpoint dir under RUN_ID/rank-K/ with the ordinary sync engine, and a
// generation's checkpoint counts only as a whole set.
//
// The protocol, in the run's prefix of the bucket:
//   rank-K/manifest.json, rank-K/checkpoints/...   rank K's own commits (the
//                                                  sync engine's layout)
//   rank-K/sets/set-FORMED-gG-nN-ID.json           rank K's share of a set (SetId:
//                                                  the generation, when it was
//                                                  formed, the gang's size, an id
//                                                  minted with it): a copy of its
//                                                  manifest as its final sync left it
//   rank-K/sets/aside-....json                     a commit no set holds, kept
//   DONE, status.json                              the gang's, not a rank's
// A set is committed when every rank 0..N-1 (its N) has its share: the last
// of those writes is the commit. Restore takes the set formed last of those
// committed and rolls each rank's manifest.json back to its share of it (a
// rank that got further alone is not mixed with the others' older state); a
// rank with no share of it (no committed set, or the gang grew) starts from
// scratch, its manifest kept aside, never deleted. The sync engine treats
// the objects a share (or an aside copy) names as live
// (SyncOptions::pinned_prefix), so later commits cannot collect them; a rank
// drops its shares of sets formed before the newest committed one.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/cancel.h"
#include "common/status.h"
#include "storage/object_store.h"

namespace spotvisor {

inline constexpr char kSetsDir[] = "sets/";  // under rank-K/

// The store of rank K: names go under "rank-K/", except the gang's DONE and
// status.json, which stay at the run's root. The rank is set once the gang
// has formed (SetRank); until then only CheckAccess and Describe work.
class RankStore final : public ObjectStore {
 public:
  explicit RankStore(std::shared_ptr<ObjectStore> run) : run_(std::move(run)) {}
  void SetRank(int rank);
  int rank() const;

  StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                  const CallContext& ctx) override;
  StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                   const CallContext& ctx) override;
  StatusOr<std::string> ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) override;
  StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path, std::uint64_t size_hint,
                                      const CallContext& ctx) override;
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix, const CallContext& ctx) override;
  Status Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) override;
  Status CheckAccess(const CallContext& ctx) override { return run_->CheckAccess(ctx); }
  std::string Describe() const override;

 private:
  StatusOr<std::string> Name(const std::string& name) const;
  std::shared_ptr<ObjectStore> run_;
  mutable std::mutex mu_;
  int rank_ = -1;
};

// A shared store as the unique_ptr the sync engine takes.
class SharedStore final : public ObjectStore {
 public:
  explicit SharedStore(std::shared_ptr<ObjectStore> s) : s_(std::move(s)) {}
  StatusOr<ObjectInfo> UploadFile(const std::string& name, const std::string& path, const Precondition& pre,
                                  const CallContext& ctx) override {
    return s_->UploadFile(name, path, pre, ctx);
  }
  StatusOr<ObjectInfo> UploadBytes(const std::string& name, const std::string& data, const Precondition& pre,
                                   const CallContext& ctx) override {
    return s_->UploadBytes(name, data, pre, ctx);
  }
  StatusOr<std::string> ReadBytes(const std::string& name, ObjectInfo* info, const CallContext& ctx) override {
    return s_->ReadBytes(name, info, ctx);
  }
  StatusOr<ObjectInfo> DownloadToFile(const std::string& name, const std::string& path, std::uint64_t size_hint,
                                      const CallContext& ctx) override {
    return s_->DownloadToFile(name, path, size_hint, ctx);
  }
  StatusOr<std::vector<ObjectInfo>> List(const std::string& prefix, const CallContext& ctx) override {
    return s_->List(prefix, ctx);
  }
  Status Delete(const std::string& name, const Precondition& pre, const CallContext& ctx) override {
    return s_->Delete(name, pre, ctx);
  }
  Status CheckAccess(const CallContext& ctx) override { return s_->CheckAccess(ctx); }
  std::string Describe() const override { return s_->Describe(); }

 private:
  std::shared_ptr<ObjectStore> s_;
};

// What the daemon keeps of a gang-checkpoint = all run's stores: the run's
// root (the sets) and this member's rank store (set once the gang formed).
struct GangStores {
  std::shared_ptr<ObjectStore> run;
  std::shared_ptr<RankStore> rank;
  std::shared_ptr<ObjectStore> claims;  // the run's root, in every mode: for its claim (run/claim.h)
};

// A set's identity, written into the name of every share of it (issue #28):
// the generation's number, the time it was formed and a random id, both
// minted with the generation by the member that committed it in etcd, and the
// gang's size then. A new or wiped etcd starts counting generations at 1
// again; the id and the time tell its sets from the old epoch's, so an old
// share never completes a new set, and the newest set is the one formed last.
struct SetId {
  std::int64_t generation = 0;
  std::int64_t minted_ns = 0;  // wall clock, ns since the epoch (0: a share named by an older version)
  std::string id;              // 16 hex digits ("": an older version's share)
  int size = 0;                // ranks in the set (0: an older version's share: the gang's current size)
  friend bool operator==(const SetId&, const SetId&) = default;
  std::string Describe() const;  // "generation G's set (ID, N ranks)"
};
// Whether `a` was formed after `b` (older versions' shares before every new one).
bool FormedAfter(const SetId& a, const SetId& b);

// "rank-K/sets/set-MINTED-gG-nN-ID.json" (zero-padded: names sort by when the
// set was formed); an older version named shares "rank-K/sets/gen-G.json".
std::string SetShareName(int rank, const SetId& set);

// Rank K's share of `set`: a copy of rank-K/manifest.json as it is now
// (after that rank's final sync of the generation committed), or an empty
// share when the rank never committed anything.
Status PrepareShare(ObjectStore& run, int rank, const SetId& set, const CallContext& ctx);

// The set formed last whose every rank 0..N-1 has a share of it (N: the
// set's own size, so a set of a gang of another size still counts; an older
// version's share counts with `size`). nullopt: none.
StatusOr<std::optional<SetId>> NewestCompleteSet(ObjectStore& run, int size, const CallContext& ctx);

struct RollBack {
  std::optional<SetId> set;  // the set restored; nullopt: none, start from scratch
  bool changed = false;      // rank-K/manifest.json was rewritten (or set aside)
  int shares_dropped = 0;    // this rank's shares of sets formed before it
  // With no share of the set for this rank (there is no set, or the gang grew
  // beyond the set's size), its manifest is never deleted: a copy of it is
  // kept under this name in rank-K/sets/ (its objects stay pinned) and the
  // rank starts from scratch. "": nothing was set aside.
  std::string set_aside;
};
// Before rank K restores: make rank-K/manifest.json that rank's share of the
// newest complete set (or, with none for this rank, set it aside), and drop
// the rank's shares of older sets. Every failure is an error: a restore must
// not guess.
StatusOr<RollBack> RollBackToNewestSet(ObjectStore& run, int rank, int size, const CallContext& ctx);

// Drops rank K's shares of sets formed before `newest` (the newest complete set).
StatusOr<int> DropOlderShares(ObjectStore& run, int rank, const SetId& newest, const CallContext& ctx);

}  // namespace spotvisor
