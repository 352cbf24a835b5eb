// gang-checkpoint = all (issue #16): every rank of a gang syncs its own
// checkpoint dir under RUN_ID/rank-K/ with the ordinary sync engine, and a
// generation's checkpoint counts only as a whole set.
//
// The protocol, in the run's prefix of the bucket:
//   rank-K/manifest.json, rank-K/checkpoints/...   rank K's own commits (the
//                                                  sync engine's layout)
//   rank-K/sets/gen-G.json                         rank K's share of generation
//                                                  G: a copy of its manifest as
//                                                  its final sync of G left it
//   DONE, status.json                              the gang's, not a rank's
// Set G is committed when every rank 0..N-1 has its sets/gen-G.json: the last
// of those writes is the commit. Restore takes the newest committed set and
// rolls each rank's manifest.json back to its share of it (a rank that got
// further alone is not mixed with the others' older state); with no
// committed set, every rank starts from scratch. The sync engine treats the
// objects a share names as live (SyncOptions::pinned_prefix), so later
// commits cannot collect them; a rank drops its shares older than the newest
// committed set.
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
};

// "rank-K/sets/gen-G.json" (G zero-padded, so names sort by generation).
std::string SetShareName(int rank, std::int64_t generation);

// Rank K's share of generation G: a copy of rank-K/manifest.json as it is now
// (after that rank's final sync of G committed), or an empty share when the
// rank never committed anything.
Status PrepareShare(ObjectStore& run, int rank, std::int64_t generation, const CallContext& ctx);

// The newest generation every rank 0..size-1 has a share of (nullopt: none).
StatusOr<std::optional<std::int64_t>> NewestCompleteSet(ObjectStore& run, int size, const CallContext& ctx);

struct RollBack {
  std::optional<std::int64_t> generation;  // the set restored; nullopt: none, start from scratch
  bool changed = false;                    // rank-K/manifest.json was rewritten (or removed)
  int shares_dropped = 0;                  // this rank's shares older than the set
};
// Before rank K restores: make rank-K/manifest.json that rank's share of the
// newest complete set (or remove it when there is none), and drop the rank's
// older shares. Every failure is an error: a restore must not guess.
StatusOr<RollBack> RollBackToNewestSet(ObjectStore& run, int rank, int size, const CallContext& ctx);

// Drops rank K's shares older than `generation` (the newest complete set).
StatusOr<int> DropOlderShares(ObjectStore& run, int rank, std::int64_t generation, const CallContext& ctx);

}  // namespace spotvisor
