#include "sync/checkpoint_set.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include <fmt/format.h>

#include "storage/file_object_store.h"
#include "sync/manifest.h"
#include "sync/sync_engine.h"
#include "testing/files.h"

namespace spotvisor {
namespace {

namespace fs = std::filesystem;

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return SteadyTime{}; }
  WallTime WallNow() const override { return wall; }
  WallTime wall = std::chrono::system_clock::now();
};

struct Dir {
  Dir() {
    char tmpl[] = "/tmp/spotvisor-set-XXXXXX";
    root = mkdtemp(tmpl);
  }
  ~Dir() { fs::remove_all(root); }
  std::string root;
};

using testfiles::Read;
using testfiles::Write;

// One rank of a gang: its checkpoint dir, its store (rank-K/ of the run) and
// its sync engine, as the daemon builds them for gang-checkpoint = all.
struct Rank {
  Rank(const Dir& d, std::shared_ptr<ObjectStore> run, int k, const FakeClock& clock) : rank(k) {
    ckpt = fmt::format("{}/vm-{}/ckpt", d.root, k);
    fs::create_directories(ckpt);
    auto store = std::make_unique<RankStore>(run);
    store->SetRank(k);
    SyncOptions o;
    o.checkpoint_dir = ckpt;
    o.run_id = "gang-run";
    o.instance = fmt::format("vm-{}", k);
    o.parallelism = 2;
    o.settle = std::chrono::seconds(5);
    o.bucket_wins = true;
    o.pinned_prefix = kSetsDir;
    o.done_once = true;
    o.state_file = fmt::format("{}/vm-{}/checkpoint-state.json", d.root, k);
    engine = std::make_unique<SyncEngine>(std::move(store), o, clock);
  }
  void Save(int step) { Write(ckpt + "/shard.pt", fmt::format("rank {} step {}", rank, step)); }
  std::string Shard() const { return Read(ckpt + "/shard.pt"); }
  int rank;
  std::string ckpt;
  std::unique_ptr<SyncEngine> engine;
};

struct Gang {
  explicit Gang(int n) : run(MakeFileObjectStore(d.root + "/bucket/gang-run")) {
    for (int k = 0; k < n; ++k) ranks.push_back(std::make_unique<Rank>(d, run, k, clock));
  }
  // What the daemon does after the gang formed: roll back, then restore.
  void RestoreAll() {
    for (auto& r : ranks) {
      REQUIRE(RollBackToNewestSet(*run, r->rank, static_cast<int>(ranks.size()), Background()).ok());
      REQUIRE(r->engine->Restore().ok());
    }
  }
  // The set a generation of this gang names (formed one second after the last).
  SetId Set(std::int64_t generation, const std::string& id = "") {
    SetId set;
    set.generation = generation;
    set.minted_ns = 1'700'000'000'000'000'000 + ++formed * 1'000'000'000LL;
    set.id = id.empty() ? fmt::format("{:016x}", 0xabc000 + formed) : id;
    set.size = static_cast<int>(ranks.size());
    return set;
  }
  // Each rank's final sync of `generation`, then its share; returns the set.
  SetId FinalSync(std::int64_t generation, int except = -1) {
    auto set = Set(generation);
    for (auto& r : ranks) {
      if (r->rank == except) continue;
      auto s = r->engine->Sync(SyncKind::kCompleted);
      REQUIRE(s.ok());
      REQUIRE_FALSE(s->deferred);
      REQUIRE(PrepareShare(*run, r->rank, set, Background()).ok());
    }
    return set;
  }
  std::int64_t formed = 0;
  Dir d;
  FakeClock clock;
  std::shared_ptr<ObjectStore> run;
  std::vector<std::unique_ptr<Rank>> ranks;
};

TEST_CASE("a rank's store keeps its objects under rank-K/, the gang's DONE and status.json at the run's root") {
  Dir d;
  std::shared_ptr<ObjectStore> run = MakeFileObjectStore(d.root + "/bucket/run");
  RankStore store(run);
  // Before the gang formed there is no rank: nothing is read or written.
  CHECK(store.UploadBytes(kManifestObject, "{}", {}, Background()).status().code() == StatusCode::kFailedPrecondition);
  store.SetRank(2);
  CHECK(store.Describe() == run->Describe() + "/rank-2");
  REQUIRE(store.UploadBytes(kManifestObject, "m", {}, Background()).ok());
  REQUIRE(store.UploadBytes("checkpoints/a~1.x", "a", {}, Background()).ok());
  REQUIRE(store.UploadBytes(kDoneObject, "done", {}, Background()).ok());
  CHECK(Read(d.root + "/bucket/run/rank-2/manifest.json") == "m");
  CHECK(Read(d.root + "/bucket/run/DONE") == "done");
  auto listed = store.List("checkpoints/", Background());
  REQUIRE(listed.ok());
  REQUIRE(listed->size() == 1);
  CHECK((*listed)[0].name == "checkpoints/a~1.x");  // relative to the rank, as the engine expects
  // Another rank's objects are not this rank's.
  RankStore other(run);
  other.SetRank(1);
  auto none = other.List("checkpoints/", Background());
  REQUIRE(none.ok());
  CHECK(none->empty());
}

TEST_CASE("a set counts only when every rank has its share, and restore never mixes shards of two generations") {
  Gang g(3);
  g.RestoreAll();  // nothing yet: every rank starts from scratch
  for (auto& r : g.ranks) r->Save(100);
  auto set1 = g.FinalSync(1);
  auto newest = NewestCompleteSet(*g.run, 3, Background());
  REQUIRE(newest.ok());
  CHECK(*newest == std::optional<SetId>(set1));

  // Generation 2: ranks 0 and 1 save step 200 and commit; rank 2 dies before
  // its final sync (its lease expired), so set 2 is not complete.
  for (auto& r : g.ranks) r->Save(200);
  g.FinalSync(2, /*except=*/2);
  newest = NewestCompleteSet(*g.run, 3, Background());
  REQUIRE(newest.ok());
  CHECK(*newest == std::optional<SetId>(set1));

  // The gang forms again: every rank restores set 1, including the two that
  // got further alone.
  g.RestoreAll();
  for (auto& r : g.ranks) CHECK(r->Shard() == fmt::format("rank {} step 100", r->rank));

  // And the next set completes on top of it; older shares are dropped once
  // a newer set is complete.
  for (auto& r : g.ranks) r->Save(300);
  auto set3 = g.FinalSync(3);
  g.RestoreAll();
  for (auto& r : g.ranks) CHECK(r->Shard() == fmt::format("rank {} step 300", r->rank));
  CHECK_FALSE(fs::exists(g.d.root + "/bucket/gang-run/" + SetShareName(0, set1)));
  CHECK(fs::exists(g.d.root + "/bucket/gang-run/" + SetShareName(0, set3)));
}

TEST_CASE("objects a share names survive later commits of the rank, so the previous set stays restorable") {
  Gang g(2);
  g.RestoreAll();
  for (auto& r : g.ranks) r->Save(1);
  g.FinalSync(1);
  // Rank 0 saves and syncs again and again in generation 2 (periodic syncs):
  // each commit would collect the objects of the one before.
  for (int step = 2; step < 5; ++step) {
    g.ranks[0]->Save(step);
    auto s = g.ranks[0]->engine->Sync(SyncKind::kCompleted);
    REQUIRE(s.ok());
    REQUIRE_FALSE(s->deferred);
  }
  // Generation 2 never completes (rank 1 has no share of it): a fresh VM for
  // rank 0 restores set 1's step 1, whose object is still in the bucket.
  Rank fresh0(g.d, g.run, 0, g.clock);
  fs::remove_all(fresh0.ckpt);
  fs::create_directories(fresh0.ckpt);
  REQUIRE(RollBackToNewestSet(*g.run, 0, 2, Background()).ok());
  auto r = fresh0.engine->Restore();
  REQUIRE(r.ok());
  CHECK(fresh0.Shard() == "rank 0 step 1");
}

// What a restore set aside on this rank's disk (every generation of it).
std::vector<std::string> SetAsideShards(const Rank& r) {
  std::vector<std::string> out;
  auto top = r.ckpt + "/" + kSetAsideDir;
  if (!fs::exists(top)) return out;
  for (auto const& gen : fs::directory_iterator(top)) {
    if (fs::exists(gen.path() / "shard.pt")) out.push_back(Read((gen.path() / "shard.pt").string()));
  }
  return out;
}

TEST_CASE("no complete set: every rank starts from scratch even if some committed alone, and nothing is deleted") {
  Gang g(2);
  g.RestoreAll();
  g.ranks[0]->Save(7);
  g.FinalSync(1, /*except=*/1);  // only rank 0 has a share
  auto rb = RollBackToNewestSet(*g.run, 0, 2, Background());
  REQUIRE(rb.ok());
  CHECK_FALSE(rb->set.has_value());
  CHECK(rb->changed);  // its manifest goes: nothing of it may be restored
  // ... but the commit stays in the bucket, its objects pinned (issue #28).
  REQUIRE_FALSE(rb->set_aside.empty());
  auto aside = ParseManifest(Read(g.d.root + "/bucket/gang-run/" + rb->set_aside), "aside", "/nonexistent");
  REQUIRE(aside.ok());
  REQUIRE(aside->files.size() == 1);
  CHECK(fs::exists(g.d.root + "/bucket/gang-run/rank-0/" + aside->files[0].object));
  REQUIRE(g.ranks[0]->engine->Restore().ok());
  // Set aside on the disk too, not lost: no rank resumes from a save the others lack.
  CHECK_FALSE(fs::exists(g.ranks[0]->ckpt + "/shard.pt"));
  CHECK(SetAsideShards(*g.ranks[0]) == std::vector<std::string>{"rank 0 step 7"});
}

TEST_CASE("an old etcd's generation never completes a new etcd's set, and the set formed last wins") {
  // Issue #28: a new or wiped etcd counts generations from 1 again.
  Gang g(2);
  g.RestoreAll();
  for (auto& r : g.ranks) r->Save(5);
  auto old5 = g.FinalSync(5);  // the old etcd's generation 5, complete
  // The new etcd's generation 1: rank 0 commits its share; rank 1's share of
  // the old etcd's generation 1 (left over) must not complete it.
  SetId stale = g.Set(1, "00000000000000aa");
  stale.minted_ns = old5.minted_ns - 10'000'000'000;
  REQUIRE(PrepareShare(*g.run, 1, stale, Background()).ok());
  for (auto& r : g.ranks) r->Save(6);
  auto new1 = g.FinalSync(1, /*except=*/1);
  auto newest = NewestCompleteSet(*g.run, 2, Background());
  REQUIRE(newest.ok());
  CHECK(*newest == std::optional<SetId>(old5));
  // Rank 1 commits its share of the new generation 1: formed after the old
  // generation 5, it is the newest, though its number is lower.
  REQUIRE(g.ranks[1]->engine->Sync(SyncKind::kCompleted).ok());
  REQUIRE(PrepareShare(*g.run, 1, new1, Background()).ok());
  newest = NewestCompleteSet(*g.run, 2, Background());
  REQUIRE(newest.ok());
  CHECK(*newest == std::optional<SetId>(new1));
  g.RestoreAll();
  for (auto& r : g.ranks) CHECK(r->Shard() == fmt::format("rank {} step 6", r->rank));
  // The old sets' shares are dropped, the new one's kept.
  CHECK_FALSE(fs::exists(g.d.root + "/bucket/gang-run/" + SetShareName(0, old5)));
  CHECK(fs::exists(g.d.root + "/bucket/gang-run/" + SetShareName(0, new1)));
}

TEST_CASE("a gang that grows or shrinks resumes from the newest whole set and never deletes committed work") {
  // Issue #28: gang-size 2 -> 3 found "no complete set" and deleted every
  // rank's manifest.
  Gang two(2);
  two.RestoreAll();
  for (auto& r : two.ranks) r->Save(10);
  auto set = two.FinalSync(1);
  // Three ranks now (the same bucket): ranks 0 and 1 resume from the set of
  // two; rank 2, beyond it, starts fresh.
  for (int k = 0; k < 3; ++k) {
    auto rb = RollBackToNewestSet(*two.run, k, 3, Background());
    REQUIRE(rb.ok());
    REQUIRE(rb->set.has_value());
    CHECK(*rb->set == set);
    CHECK(rb->set_aside.empty());
  }
  CHECK(fs::exists(two.d.root + "/bucket/gang-run/rank-0/manifest.json"));
  CHECK(fs::exists(two.d.root + "/bucket/gang-run/rank-1/manifest.json"));
  CHECK_FALSE(fs::exists(two.d.root + "/bucket/gang-run/rank-2/manifest.json"));
  // Back to one rank: rank 0 resumes from the same set.
  auto one = RollBackToNewestSet(*two.run, 0, 1, Background());
  REQUIRE(one.ok());
  REQUIRE(one->set.has_value());
  CHECK(*one->set == set);
  CHECK(fs::exists(two.d.root + "/bucket/gang-run/rank-0/manifest.json"));
}

TEST_CASE("a rank that never saved has an empty share, and the set still completes") {
  Gang g(2);
  g.RestoreAll();
  g.ranks[0]->Save(5);
  auto set4 = g.FinalSync(4);
  auto newest = NewestCompleteSet(*g.run, 2, Background());
  REQUIRE(newest.ok());
  CHECK(*newest == std::optional<SetId>(set4));
  g.RestoreAll();
  CHECK(g.ranks[0]->Shard() == "rank 0 step 5");
  CHECK_FALSE(fs::exists(g.ranks[1]->ckpt + "/shard.pt"));
}

TEST_CASE("share names and texts from the bucket are checked, never trusted") {
  Dir d;
  std::shared_ptr<ObjectStore> run = MakeFileObjectStore(d.root + "/bucket/run");
  // Names that are not shares are ignored; a rank beyond the size does not count.
  Write(d.root + "/bucket/run/rank-0/sets/gen-000000000009.json", "{\"version\":2,\"empty\":true}");
  Write(d.root + "/bucket/run/rank-1/sets/gen-0000000000x9.json", "{}");
  Write(d.root + "/bucket/run/rank-x/sets/gen-000000000009.json", "{}");
  Write(d.root + "/bucket/run/rank-5/sets/gen-000000000009.json", "{}");
  auto newest = NewestCompleteSet(*run, 2, Background());
  REQUIRE(newest.ok());
  CHECK_FALSE(newest->has_value());
  Write(d.root + "/bucket/run/rank-1/sets/gen-000000000009.json", "not json");
  newest = NewestCompleteSet(*run, 2, Background());
  REQUIRE(newest.ok());
  REQUIRE(newest->has_value());
  CHECK((*newest)->generation == 9);  // an older version's shares still count
  CHECK((*newest)->id.empty());
  // Rolling back to a share that is not a manifest is an error, not a guess.
  auto rb = RollBackToNewestSet(*run, 1, 2, Background());
  CHECK_FALSE(rb.ok());
  CHECK(NewestCompleteSet(*run, 0, Background()).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spotvisor
