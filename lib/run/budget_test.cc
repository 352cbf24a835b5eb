#include "run/budget.h"

#include <filesystem>

#include <catch2/catch.hpp>

#include "storage/file_object_store.h"

namespace spotvisor {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return SteadyTime{}; }
  WallTime WallNow() const override { return wall; }
  WallTime wall = std::chrono::time_point_cast<WallTime::duration>(std::chrono::system_clock::now());
};

Boot Ended(const std::string& name, const std::string& reason, int minute) {
  Boot b;
  b.name = name;
  b.started_at = WallTime{} + std::chrono::minutes(minute);
  if (!reason.empty()) b.ended_at = b.started_at + 1min;
  b.reason = reason;
  return b;
}

TEST_CASE("failed boots in a row: preemptions and vanished VMs neither count nor reset; a good ending resets") {
  CHECK(FailedInARow({}).empty());
  CHECK(FailedInARow({Ended("a", "failed", 1), Ended("b", "completed", 2)}).empty());
  CHECK(FailedInARow({Ended("a", "max-runtime", 1), Ended("b", "failed", 2), Ended("c", "preempted", 3),
                      Ended("d", "", 4), Ended("e", "mount-failed", 5)}) == std::vector<std::string>{"b", "e"});
  CHECK(FailedInARow({Ended("a", "failed", 1), Ended("b", "idle", 2), Ended("c", "restore-failed", 3),
                      Ended("d", "sync-stalled", 4), Ended("e", "sync-failed", 5)}) ==
        std::vector<std::string>{"c", "d", "e"});
  CHECK(JudgeBootEnd("run-failed") == BootVerdict::kNeutral);
  CHECK(JudgeBootEnd("already-done") == BootVerdict::kReset);
}

struct Bucket {
  std::string root = (fs::temp_directory_path() / ("budget-test-" + std::to_string(::getpid()))).string();
  Bucket() { fs::create_directories(root + "/run1"); }
  ~Bucket() { fs::remove_all(root); }
};

TEST_CASE("the budget reads the boot records, and FAILED is written once, beside DONE") {
  Bucket b;
  FakeClock clock;
  std::shared_ptr<ObjectStore> run = MakeFileObjectStore(b.root + "/run1");
  RunBudget budget(run, "run1", 3, clock);
  auto s = budget.Check(Background());
  REQUIRE(s.ok());
  CHECK_FALSE(s->failed_marker);
  CHECK(s->failed_in_a_row.empty());
  for (auto reason : {"failed", "preempted", "mount-failed"}) {
    BootRecord r(run, "run1", "vm", "z", "0000000000000001", clock);
    REQUIRE(r.Begin(Background()).ok());
    clock.wall += 10s;
    REQUIRE(r.End({reason, 1, std::nullopt, std::nullopt, 0}, Background()).ok());
    clock.wall += 10s;
  }
  // An unreadable record is skipped and named, not fatal.
  REQUIRE(run->UploadBytes("boots/zzz.json", "{not json", {}, Background()).ok());
  std::vector<std::string> problems;
  s = budget.Check(Background(), &problems);
  REQUIRE(s.ok());
  CHECK(s->failed_in_a_row.size() == 2);
  CHECK(problems.size() == 1);
  bool already = false;
  REQUIRE(budget.MarkFailed(s->failed_in_a_row, "vm", "2 failed boots", Background(), &already).ok());
  CHECK_FALSE(already);
  REQUIRE(budget.MarkFailed({}, "vm2", "again", Background(), &already).ok());
  CHECK(already);  // the first marker stays
  s = budget.Check(Background());
  REQUIRE(s.ok());
  REQUIRE(s->failed_marker);
  CHECK((*s->failed_marker)["instance"] == "vm");
  CHECK((*s->failed_marker)["failed_boots"].size() == 2);
  CHECK(fs::exists(b.root + "/run1/FAILED"));

  // A person deletes FAILED: the next boot gets a whole new budget, and the
  // boots after it count from it, not from the old failures.
  fs::remove(b.root + "/run1/FAILED");
  RunBudget two(run, "run1", 2, clock);  // the two failures use up a budget of 2
  s = two.Check(Background());
  REQUIRE(s.ok());
  CHECK(s->budget_reset);
  CHECK(s->failed_in_a_row.empty());
  BootRecord fresh(run, "run1", "vm", "z", "0000000000000002", clock);
  fresh.SetBudgetReset();
  REQUIRE(fresh.Begin(Background()).ok());
  clock.wall += 10s;
  REQUIRE(fresh.End({"failed", 1, std::nullopt, std::nullopt, 0}, Background()).ok());
  s = two.Check(Background());
  REQUIRE(s.ok());
  CHECK_FALSE(s->budget_reset);
  CHECK(s->failed_in_a_row == std::vector<std::string>{fresh.name()});
}

}  // namespace
}  // namespace spotvisor
