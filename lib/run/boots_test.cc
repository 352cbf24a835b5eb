#include "run/boots.h"

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

struct Bucket {
  std::string root = (fs::temp_directory_path() / ("boots-test-" + std::to_string(::getpid()))).string();
  Bucket() { fs::create_directories(root + "/run1"); }
  ~Bucket() { fs::remove_all(root); }
};

TEST_CASE("each boot of a run is recorded when it begins and completed when the run ends there, oldest first") {
  Bucket b;
  FakeClock clock;
  std::shared_ptr<ObjectStore> run = MakeFileObjectStore(b.root + "/run1");
  BootRecord first(run, "run1", "vm-a", "us-central1-a", "00000000000000aa", clock);
  REQUIRE(first.Begin(Background()).ok());
  clock.wall += 90s;
  REQUIRE(first.End({"preempted", 130, 2, 4096, 7}, Background()).ok());
  clock.wall += 60s;
  BootRecord second(run, "run1", "vm-b", "us-central1-b", "00000000000000bb", clock);
  REQUIRE(second.Begin(Background()).ok());  // still running (or its VM vanished)
  CHECK(first.name().rfind("boots/", 0) == 0);
  CHECK(first.name() < second.name());  // names sort by when the boot began
  auto top = MakeFileObjectStore(b.root);
  auto objects = top->List("run1/", Background());
  REQUIRE(objects.ok());
  auto boots = ReadBoots(*top, "run1", *objects, Background());
  CHECK(boots.problems.empty());
  REQUIRE(boots.boots.size() == 2);
  auto const& a = boots.boots[0];
  CHECK(a.instance == "vm-a");
  CHECK(a.zone == "us-central1-a");
  CHECK(a.reason == "preempted");
  CHECK(a.exit_code == 130);
  CHECK(a.vm_seconds == 90.0);
  CHECK(a.uncommitted_files == 2);
  CHECK(a.uncommitted_bytes == 4096u);
  CHECK(a.sequence == 7);
  auto const& c = boots.boots[1];
  CHECK(c.instance == "vm-b");
  CHECK_FALSE(c.ended_at.has_value());
  CHECK(c.reason.empty());
  CHECK_FALSE(c.exit_code.has_value());
}

TEST_CASE("a boot record from the bucket is checked field by field") {
  Boot b;
  b.run_id = "r";
  b.instance = "vm";
  b.token = "t";
  b.started_at = std::chrono::time_point_cast<WallTime::duration>(std::chrono::system_clock::now());
  auto back = ParseBoot("n", BootJson(b));
  REQUIRE(back.ok());
  CHECK(back->started_at == b.started_at);
  CHECK_FALSE(back->ended_at.has_value());
  for (const char* bad : {"", "[]", R"({"run_id":"r","instance":"v","token":"t"})",
                          R"({"run_id":"r","instance":"v","token":"t","started_at":"yesterday"})",
                          R"({"run_id":"r","instance":"v","token":"t","started_at":"2026-01-01T00:00:00Z","exit_code":1.5})",
                          R"({"run_id":"r","instance":"v","token":"t","started_at":"2026-01-01T00:00:00Z","vm_seconds":-1})",
                          R"({"run_id":7,"instance":"v","token":"t","started_at":"2026-01-01T00:00:00Z"})"}) {
    INFO(bad);
    CHECK_FALSE(ParseBoot("n", bad).ok());
  }
}

}  // namespace
}  // namespace spotvisor
