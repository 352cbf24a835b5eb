#include "sync/sync_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "storage/file_object_store.h"

namespace spotvisor {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return SteadyTime{}; }
  WallTime WallNow() const override { return wall; }
  WallTime wall = std::chrono::system_clock::now();
};

// A store that fails chosen writes: a sync cut off before its commit.
class FailingStore final : public ObjectStore {
 public:
  FailingStore(std::unique_ptr<ObjectStore> inner, std::string fail_name) : inner_(std::move(inner)), fail_(std::move(fail_name)) {}
  StatusOr<ObjectInfo> UploadFile(const std::string& n, const std::string& p, const Precondition& pre) override {
    return inner_->UploadFile(n, p, pre);
  }
  StatusOr<ObjectInfo> UploadBytes(const std::string& n, const std::string& d, const Precondition& pre) override {
    if (n == fail_) return UnavailableError("power cut");
    return inner_->UploadBytes(n, d, pre);
  }
  StatusOr<std::string> ReadBytes(const std::string& n, ObjectInfo* i) override { return inner_->ReadBytes(n, i); }
  StatusOr<ObjectInfo> DownloadToFile(const std::string& n, const std::string& p) override { return inner_->DownloadToFile(n, p); }
  StatusOr<std::vector<ObjectInfo>> List(const std::string& p) override { return inner_->List(p); }
  Status Delete(const std::string& n, const Precondition& pre) override { return inner_->Delete(n, pre); }
  Status CheckAccess() override { return inner_->CheckAccess(); }
  std::string Describe() const override { return inner_->Describe(); }

 private:
  std::unique_ptr<ObjectStore> inner_;
  std::string fail_;
};

struct Dirs {
  Dirs() {
    char tmpl[] = "/tmp/spotvisor-sync-XXXXXX";
    root = mkdtemp(tmpl);
    bucket = root + "/bucket";
    ckpt = root + "/ckpt";
    fs::create_directories(ckpt);
  }
  ~Dirs() { fs::remove_all(root); }
  std::string root, bucket, ckpt;
};

void Write(const std::string& path, const std::string& data) {
  fs::create_directories(fs::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << data;
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Makes a file look `age` old on the injected wall clock.
void Age(const std::string& path, const FakeClock& clock, std::chrono::seconds age) {
  auto t = clock.wall - age;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  timespec ts[2] = {{ns / 1'000'000'000, ns % 1'000'000'000}, {ns / 1'000'000'000, ns % 1'000'000'000}};
  REQUIRE(utimensat(AT_FDCWD, path.c_str(), ts, 0) == 0);
}

SyncEngine Engine(const Dirs& d, const FakeClock& clock, const std::string& ckpt = "") {
  SyncOptions o{ckpt.empty() ? d.ckpt : ckpt, "run1", "vm-a", 3, 5s};
  return SyncEngine(MakeFileObjectStore(d.bucket + "/run1"), o, clock);
}

TEST_CASE("sync, reboot, restore: the bytes come back identical") {
  Dirs d;
  FakeClock clock;
  Write(d.ckpt + "/model.ckpt", std::string(100000, 'm'));
  Write(d.ckpt + "/opt/state.bin", "optimizer");
  Age(d.ckpt + "/model.ckpt", clock, 60s);
  Age(d.ckpt + "/opt/state.bin", clock, 60s);
  {
    auto e = Engine(d, clock);
    auto r = e.Restore();
    REQUIRE(r.ok());
    CHECK_FALSE(r->resumed);
    auto s = e.Sync(false);
    REQUIRE(s.ok());
    CHECK(s->files_uploaded == 2);
    CHECK(s->files_total == 2);
    CHECK(s->bytes_uploaded == 100009);
  }
  auto fresh = d.root + "/fresh";  // a new VM's empty disk
  fs::create_directories(fresh);
  auto e2 = Engine(d, clock, fresh);
  auto r = e2.Restore();
  REQUIRE(r.ok());
  CHECK(r->resumed);
  CHECK(r->files == 2);
  CHECK(r->files_downloaded == 2);
  CHECK(Read(fresh + "/model.ckpt") == std::string(100000, 'm'));
  CHECK(Read(fresh + "/opt/state.bin") == "optimizer");
  // Restored files count as uploaded: nothing to send again.
  auto s = e2.Sync(true);
  REQUIRE(s.ok());
  CHECK(s->files_uploaded == 0);
}

TEST_CASE("incremental: unchanged files are never uploaded twice; the old version is deleted after commit") {
  Dirs d;
  FakeClock clock;
  Write(d.ckpt + "/a", "a1");
  Write(d.ckpt + "/b", "b1");
  auto e = Engine(d, clock);
  REQUIRE(e.Restore().ok());
  REQUIRE(e.Sync(true)->files_uploaded == 2);
  auto manifest_before = fs::last_write_time(d.bucket + "/run1/manifest.json");
  auto noop = e.Sync(true);
  REQUIRE(noop.ok());
  CHECK(noop->files_uploaded == 0);
  CHECK(noop->sequence == 1);  // no new commit
  CHECK(fs::last_write_time(d.bucket + "/run1/manifest.json") == manifest_before);
  Write(d.ckpt + "/b", "b2-longer");
  auto s = e.Sync(true);
  REQUIRE(s.ok());
  CHECK(s->files_uploaded == 1);
  CHECK(s->bytes_uploaded == 9);
  CHECK(s->files_deleted == 1);
  std::vector<std::string> objects;
  for (auto const& entry : fs::recursive_directory_iterator(d.bucket + "/run1/checkpoints")) {
    objects.push_back(fs::relative(entry.path(), d.bucket + "/run1/checkpoints").string());
  }
  std::sort(objects.begin(), objects.end());
  CHECK(objects == std::vector<std::string>{"a~1", "b~2"});
}

TEST_CASE("a sync cut off before its commit leaves the previous checkpoint restorable") {
  Dirs d;
  FakeClock clock;
  Write(d.ckpt + "/model", "epoch-1");
  {
    auto e = Engine(d, clock);
    REQUIRE(e.Restore().ok());
    REQUIRE(e.Sync(true).ok());
  }
  {
    SyncOptions o{d.ckpt, "run1", "vm-a", 2, 5s};
    SyncEngine e(std::make_unique<FailingStore>(MakeFileObjectStore(d.bucket + "/run1"), "manifest.json"), o, clock);
    REQUIRE(e.Restore().ok());
    Write(d.ckpt + "/model", "epoch-2, half uploaded");
    auto s = e.Sync(true);
    CHECK_FALSE(s.ok());
  }
  auto fresh = d.root + "/fresh";
  fs::create_directories(fresh);
  auto e = Engine(d, clock, fresh);
  REQUIRE(e.Restore().ok());
  CHECK(Read(fresh + "/model") == "epoch-1");
}

TEST_CASE("two VMs sharing a run-id cannot overwrite each other's commit") {
  Dirs d;
  FakeClock clock;
  Write(d.ckpt + "/m", "x");
  auto other_dir = d.root + "/other";
  fs::create_directories(other_dir);
  Write(other_dir + "/m", "y");
  auto a = Engine(d, clock);
  auto b = Engine(d, clock, other_dir);
  REQUIRE(a.Restore().ok());
  REQUIRE(b.Restore().ok());
  REQUIRE(a.Sync(true).ok());
  auto s = b.Sync(true);
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == StatusCode::kFailedPrecondition);
  CHECK(s.status().message().find("another VM is using run-id \"run1\"") != std::string::npos);
}

TEST_CASE("a deleted file is dropped from the next manifest and its object deleted") {
  Dirs d;
  FakeClock clock;
  Write(d.ckpt + "/keep", "k");
  Write(d.ckpt + "/gone", "g");
  auto e = Engine(d, clock);
  REQUIRE(e.Restore().ok());
  REQUIRE(e.Sync(true).ok());
  fs::remove(d.ckpt + "/gone");
  auto s = e.Sync(true);
  REQUIRE(s.ok());
  CHECK(s->files_total == 1);
  CHECK(s->files_deleted == 1);
  CHECK_FALSE(fs::exists(d.bucket + "/run1/checkpoints/gone~1"));
}

TEST_CASE("fresh files wait for sync-settle, except in the final sync") {
  Dirs d;
  FakeClock clock;
  Write(d.ckpt + "/old", "o");
  Write(d.ckpt + "/writing", "w");
  Age(d.ckpt + "/old", clock, 10s);
  Age(d.ckpt + "/writing", clock, 1s);
  auto e = Engine(d, clock);
  REQUIRE(e.Restore().ok());
  auto s = e.Sync(false);
  REQUIRE(s.ok());
  CHECK(s->files_uploaded == 1);
  CHECK(s->files_deferred == 1);
  auto f = e.Sync(true);
  REQUIRE(f.ok());
  CHECK(f->files_uploaded == 1);
  CHECK(f->files_total == 2);
}

TEST_CASE("no sync before a restore: it could overwrite a newer checkpoint") {
  Dirs d;
  FakeClock clock;
  auto e = Engine(d, clock);
  CHECK(e.Sync(true).status().code() == StatusCode::kFailedPrecondition);
}

TEST_CASE("DONE: a finished run is not trained again") {
  Dirs d;
  FakeClock clock;
  {
    auto e = Engine(d, clock);
    REQUIRE(e.Restore().ok());
    REQUIRE(e.WriteDone(0).ok());
  }
  auto e = Engine(d, clock);
  auto r = e.Restore();
  REQUIRE(r.ok());
  CHECK(r->done);
  CHECK(r->done_marker["exit_code"] == 0);
  CHECK(r->done_marker["instance"] == "vm-a");
}

TEST_CASE("manifest paths that would escape the checkpoint dir are refused") {
  CHECK(IsSafeRelativePath("a/b.ckpt"));
  for (auto bad : {"", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/."}) {
    INFO(bad);
    CHECK_FALSE(IsSafeRelativePath(bad));
  }
  Dirs d;
  FakeClock clock;
  Write(d.bucket + "/run1/checkpoints/x~1", "evil");
  Write(d.bucket + "/run1/manifest.json",
        R"({"version":1,"sequence":1,"files":[{"path":"../escaped","object":"checkpoints/x~1","size":4,"crc32c":"AAAAAA==","generation":1}]})");
  auto e = Engine(d, clock);
  auto r = e.Restore();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == StatusCode::kPermissionDenied);
  CHECK_FALSE(fs::exists(d.root + "/escaped"));
}

TEST_CASE("restore does not follow a symlink planted in the checkpoint dir") {
  Dirs d;
  FakeClock clock;
  auto outside = d.root + "/outside";
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, d.ckpt + "/sub");
  {
    auto staging = d.root + "/staging";
    Write(staging + "/sub/x", "data");
    auto e = Engine(d, clock, staging);
    REQUIRE(e.Restore().ok());
    REQUIRE(e.Sync(true).ok());
  }
  auto e = Engine(d, clock);
  auto r = e.Restore();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("symlink") != std::string::npos);
  CHECK(fs::is_empty(outside));
}

TEST_CASE("a corrupted object fails the restore instead of starting from it") {
  Dirs d;
  FakeClock clock;
  Write(d.ckpt + "/m", "good bytes");
  {
    auto e = Engine(d, clock);
    REQUIRE(e.Restore().ok());
    REQUIRE(e.Sync(true).ok());
  }
  Write(d.bucket + "/run1/checkpoints/m~1", "BAD bytes!");  // same size, other content
  auto fresh = d.root + "/fresh";
  fs::create_directories(fresh);
  auto e = Engine(d, clock, fresh);
  auto r = e.Restore();
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message().find("does not match the manifest") != std::string::npos);
  CHECK_FALSE(fs::exists(fresh + "/m"));
}

}  // namespace
}  // namespace spotvisor
