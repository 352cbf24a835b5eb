#include "run/claim.h"

#include <filesystem>

#include <catch2/catch.hpp>

#include "storage/file_object_store.h"
#include "testing/files.h"

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
  std::string root = fs::temp_directory_path() / ("claim-test-" + std::to_string(::getpid()) + "-" +
                                                  std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  Bucket() { fs::create_directories(root + "/run1"); }
  ~Bucket() { fs::remove_all(root); }
};

TEST_CASE("a claim is written before anything else, renewed, expires by itself and goes when released") {
  Bucket b;
  FakeClock clock;
  std::shared_ptr<ObjectStore> run = MakeFileObjectStore(b.root + "/run1");
  RunClaim claim(run, "run1", "vm-a", 600s, clock);
  REQUIRE(claim.Renew("restoring", Background()).ok());
  CHECK(claim.name().rfind("claims/vm-a.", 0) == 0);
  auto top = MakeFileObjectStore(b.root);
  auto objects = top->List("run1/", Background());
  REQUIRE(objects.ok());
  auto read = ReadClaims(*top, "run1", *objects, Background());
  REQUIRE(read.claims.size() == 1);
  CHECK(read.problems.empty());
  auto const& c = read.claims.front();
  CHECK(c.instance == "vm-a");
  CHECK(c.state == "restoring");
  CHECK(c.expires_at == clock.wall + 600s);
  CHECK(read.AnyLive(clock.wall));
  // Nobody renews it: live through its lifetime and the clocks' allowance, then not.
  CHECK(read.AnyLive(clock.wall + 600s + kClaimSkew - 1s));
  CHECK_FALSE(read.AnyLive(clock.wall + 600s + kClaimSkew));
  // Renewed later: the same object, a later expiry.
  auto claimed = c.claimed_at;
  clock.wall += 200s;
  REQUIRE(claim.Renew("running", Background()).ok());
  objects = top->List("run1/", Background());
  read = ReadClaims(*top, "run1", *objects, Background());
  REQUIRE(read.claims.size() == 1);
  CHECK(read.claims.front().claimed_at == claimed);
  CHECK(read.claims.front().expires_at == clock.wall + 600s);
  CHECK(read.claims.front().state == "running");
  // Released: gone.
  REQUIRE(claim.Release(Background()).ok());
  objects = top->List("run1/", Background());
  CHECK(ReadClaims(*top, "run1", *objects, Background()).claims.empty());
  CHECK(claim.Release(Background()).ok());  // twice is fine
}

TEST_CASE("two processes on one VM never share a claim's name") {
  Bucket b;
  FakeClock clock;
  std::shared_ptr<ObjectStore> run = MakeFileObjectStore(b.root + "/run1");
  RunClaim a(run, "run1", "vm-a", 600s, clock), again(run, "run1", "vm-a", 600s, clock);
  CHECK(a.name() != again.name());
  RunClaim odd(run, "run1", "a/b c\xff", 600s, clock);
  CHECK(odd.name().find('/', 7) == std::string::npos);  // one path segment after claims/
}

TEST_CASE("a claim from the bucket is checked field by field, and a doubt counts as live") {
  Claim c;
  c.run_id = "r";
  c.instance = "vm";
  c.token = "t";
  c.state = "running";
  c.claimed_at = c.renewed_at = std::chrono::time_point_cast<WallTime::duration>(std::chrono::system_clock::now());
  c.expires_at = c.renewed_at + 60s;
  c.ttl = 60s;
  auto back = ParseClaim("r/claims/x", ClaimJson(c));
  REQUIRE(back.ok());
  CHECK(back->expires_at == c.expires_at);
  for (const char* bad : {"", "[]", "{}", R"({"run_id":1})",
                          R"({"run_id":"r","instance":"v","token":"t","state":"s","claimed_at":"x","renewed_at":"x","expires_at":"x","ttl_s":60})",
                          R"({"run_id":"r","instance":"v","token":"t","state":"s","claimed_at":"2026-01-01T00:00:00Z","renewed_at":"2026-01-01T00:00:00Z","expires_at":"2026-01-01T00:00:00Z","ttl_s":0})"}) {
    INFO(bad);
    CHECK_FALSE(ParseClaim("n", bad).ok());
  }
  Bucket b;
  testfiles::Write(b.root + "/run1/claims/broken.json", "{not json");
  auto top = MakeFileObjectStore(b.root);
  auto objects = top->List("run1/", Background());
  REQUIRE(objects.ok());
  auto read = ReadClaims(*top, "run1", *objects, Background());
  CHECK(read.problems.size() == 1);
  CHECK(read.AnyLive(c.renewed_at + 1000h));
}

}  // namespace
}  // namespace spotvisor
