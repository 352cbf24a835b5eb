#include <sys/mount.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>

#include "mount/devices.h"
#include "mount/guarded_store.h"
#include "mount/mount_manager.h"
#include "mount/mounter.h"
#include "mount/mountinfo.h"

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

TEST_CASE("mountinfo: fields, optional tags, octal escapes, the topmost mount wins") {
  auto t = ParseMountInfo(
      "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
      "36 22 7:3 / /mnt/my\\040data ro,noatime master:1 shared:2 - ext4 /dev/loop3 ro,norecovery\n"
      "40 22 0:50 / /mnt/result rw,nosuid,nodev - fuse.rclone spotvisorgcs:bucket rw,user_id=0\n"
      "41 40 0:51 / /mnt/result rw - tmpfs other rw\n");
  REQUIRE(t.ok());
  REQUIRE(t->size() == 4);
  auto const& d = (*t)[1];
  CHECK(d.mount_point == "/mnt/my data");
  CHECK((d.major == 7 && d.minor == 3));
  CHECK(d.fstype == "ext4");
  CHECK(d.source == "/dev/loop3");
  CHECK(d.read_only());
  CHECK_FALSE((*t)[0].read_only());
  CHECK(FindMountAt(*t, "/mnt/result")->fstype == "tmpfs");
  CHECK_FALSE(FindMountAt(*t, "/mnt").has_value());
  CHECK_FALSE(ParseMountInfo("36 22 7:3 / /x rw\n").ok());  // no " - " separator
}

TEST_CASE("mount options: flags become mount(2) flags, the rest the data string") {
  auto f = ParseMountOptions("ro,noatime,noload,errors=remount-ro");
  REQUIRE(f.ok());
  CHECK(f->flags == (MS_RDONLY | MS_NOATIME));
  CHECK(f->data == "noload,errors=remount-ro");
  auto g = ParseMountOptions("ro,rw,defaults");
  REQUIRE(g.ok());
  CHECK(g->flags == 0);  // rw undoes ro, as mount(8) does
  CHECK_FALSE(ParseMountOptions("bind").ok());
  CHECK_FALSE(ParseMountOptions("remount,ro").ok());
  CHECK(ParseMountOptions("").ok());
}

TEST_CASE("device names: by-id candidates in order, /dev paths as given") {
  auto c = DeviceCandidates("data", "/d");
  REQUIRE(c.size() >= 2);
  CHECK(c[0] == "/d/google-data");
  CHECK(c[1] == "/d/scsi-0Google_PersistentDisk_data");
  CHECK(DeviceCandidates("/dev/nvme0n2", "/d") == std::vector<std::string>{"/dev/nvme0n2"});
}

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  WallTime WallNow() const override { return {}; }
  SteadyTime now{};
};

// Moves the clock instead of sleeping; runs `at_sleep` before each "sleep".
class ClockSleeper final : public Sleeper {
 public:
  explicit ClockSleeper(FakeClock& c) : clock(c) {}
  bool SleepFor(std::chrono::milliseconds d) override {
    ++sleeps;
    if (at_sleep) at_sleep(sleeps);
    clock.now += d;
    return true;
  }
  FakeClock& clock;
  int sleeps = 0;
  std::function<void(int)> at_sleep;
};

TEST_CASE("waiting for a device: found when it appears, NotFound naming every path after the timeout") {
  auto dir = std::filesystem::temp_directory_path() / ("sv-byid-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  FakeClock clock;
  ClockSleeper sleeper(clock);
  DeviceWait w{"late", 10s, 250ms, dir.string()};
  std::vector<std::string> told;
  // A block device node to link to: /dev/loop0 exists wherever loop devices do.
  bool have_block = access("/dev/loop0", F_OK) == 0;
  if (have_block) {
    sleeper.at_sleep = [&](int n) {
      if (n == 3) std::filesystem::create_symlink("/dev/loop0", dir / "scsi-0Google_PersistentDisk_late");
    };
    auto found = WaitForDevice(w, clock, sleeper, [&](const std::vector<std::string>& l) { told = l; });
    REQUIRE(found.ok());
    CHECK(*found == (dir / "scsi-0Google_PersistentDisk_late").string());
    CHECK(sleeper.sleeps == 3);
    CHECK(told.size() == DeviceCandidates("late", dir.string()).size());  // said once, with every path
  }
  ClockSleeper idle(clock);
  DeviceWait gone{"gone", 2s, 250ms, dir.string()};
  auto missing = WaitForDevice(gone, clock, idle);
  REQUIRE_FALSE(missing.ok());
  CHECK(missing.status().code() == StatusCode::kNotFound);
  CHECK(missing.status().message().find((dir / "google-gone").string()) != std::string::npos);
  CHECK(missing.status().message().find("device-name=gone") != std::string::npos);
  CHECK(idle.sleeps == 8);  // 2 s in 250 ms polls, no sleeping past the deadline
  CHECK_FALSE(WaitForDevice(DeviceWait{"a/b", 1s, 250ms, dir.string()}, clock, idle).ok());
  std::filesystem::remove_all(dir);
}

TEST_CASE("the FUSE command lines: gcsfuse stays in the foreground, rclone's remote is in the environment") {
  MountOptions o;
  o.bucket = "gs://results/exp1";
  o.bucket_mount = "/mnt/result";
  o.storage_endpoint = "http://127.0.0.1:9000";
  o.storage_auth = false;
  o.owner = UserInfo{"trainer", 1001, 1002, "/home/trainer", "/bin/sh", {}};
  o.extra_args = {"--stat-cache-ttl", "1m"};
  std::vector<std::string> env;
  auto g = FuseCommand(o, env);
  REQUIRE(g.ok());
  CHECK((*g)[0] == "gcsfuse");
  CHECK((*g)[1] == "--foreground");
  CHECK(std::find(g->begin(), g->end(), "--anonymous-access") != g->end());
  auto uid = std::find(g->begin(), g->end(), "--uid");
  REQUIRE(uid != g->end());
  CHECK(*(uid + 1) == "1001");
  CHECK(std::vector<std::string>(g->end() - 4, g->end()) ==
        std::vector<std::string>{"--stat-cache-ttl", "1m", "results", "/mnt/result"});
  CHECK(env.empty());

  o.driver = "rclone";
  o.storage_endpoint = "https://storage.googleapis.com";  // the default: no endpoint override
  o.storage_auth = true;
  auto r = FuseCommand(o, env);
  REQUIRE(r.ok());
  CHECK(std::vector<std::string>(r->begin(), r->begin() + 4) ==
        std::vector<std::string>{"rclone", "mount", "spotvisorgcs:results", "/mnt/result"});
  auto mode = std::find(r->begin(), r->end(), "--vfs-cache-mode");
  REQUIRE(mode != r->end());
  CHECK(*(mode + 1) == "off");
  CHECK(std::find(env.begin(), env.end(), "RCLONE_CONFIG_SPOTVISORGCS_ENV_AUTH=true") != env.end());
  CHECK(std::none_of(env.begin(), env.end(), [](auto const& e) { return e.find("ENDPOINT") != std::string::npos; }));

  o.bucket = "file:///tmp/x";
  CHECK_FALSE(FuseCommand(o, env).ok());
  o.bucket = "gs://b";
  o.driver = "s3fs";
  CHECK_FALSE(FuseCommand(o, env).ok());
}


// Records calls; every operation succeeds.
class CountingStore final : public ObjectStore {
 public:
  StatusOr<ObjectInfo> UploadFile(const std::string&, const std::string&, const Precondition&, const CallContext&) override { return Hit(); }
  StatusOr<ObjectInfo> UploadBytes(const std::string&, const std::string&, const Precondition&, const CallContext&) override { return Hit(); }
  StatusOr<std::string> ReadBytes(const std::string&, ObjectInfo*, const CallContext&) override {
    ++calls;
    return std::string("x");
  }
  StatusOr<ObjectInfo> DownloadToFile(const std::string&, const std::string&, std::uint64_t, const CallContext&) override {
    return Hit();
  }
  StatusOr<std::vector<ObjectInfo>> List(const std::string&, const CallContext&) override {
    ++calls;
    return std::vector<ObjectInfo>{};
  }
  Status Delete(const std::string&, const Precondition&, const CallContext&) override {
    ++calls;
    return OkStatus();
  }
  Status CheckAccess(const CallContext&) override {
    ++calls;
    return OkStatus();
  }
  std::string Describe() const override { return "counting"; }
  ObjectInfo Hit() {
    ++calls;
    return ObjectInfo{};
  }
  int calls = 0;
};

TEST_CASE("sync-via = mount: no operation reaches the directory once the mount is gone") {
  auto inner = std::make_unique<CountingStore>();
  auto* counting = inner.get();
  bool mounted = true;
  auto store = GuardByMount(std::move(inner), [&] { return mounted ? OkStatus() : UnavailableError("gone"); });
  CHECK(store->UploadBytes("a", "b", {}, Background()).ok());
  CHECK(store->List("", Background()).ok());
  CHECK(counting->calls == 2);
  mounted = false;
  CHECK_FALSE(store->UploadBytes("a", "b", {}, Background()).ok());
  CHECK_FALSE(store->UploadFile("a", "/p", {}, Background()).ok());
  CHECK_FALSE(store->ReadBytes("a", nullptr, Background()).ok());
  CHECK_FALSE(store->DownloadToFile("a", "/p", 0, Background()).ok());
  CHECK_FALSE(store->List("", Background()).ok());
  CHECK_FALSE(store->Delete("a", {}, Background()).ok());
  CHECK_FALSE(store->CheckAccess(Background()).ok());
  CHECK(counting->calls == 2);
  CHECK(store->Describe() == "counting");
  // The real check: / is mounted, but not by FUSE.
  CHECK(CheckFuseMounted("/").code() == StatusCode::kUnavailable);
}
}  // namespace
}  // namespace spotvisor
