// Issue #4: the dataset disk (read-only), a scratch disk (formatted only if
// blank) and the bucket through a supervised FUSE daemon (gcsfuse or
// rclone), mounted in that order before restore and the trainer, and
// unmounted in reverse order after the final sync, before on-exit.
//
// Blocking: MountAll and UnmountAll run on a worker thread; the FUSE daemon
// is reaped by the supervisor through the ChildRegistry.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "log/logger.h"
#include "mount/mounter.h"
#include "process/children.h"
#include "process/user.h"
#include "retry/sleeper.h"

namespace spotvisor {

// How long the FUSE driver may take to exit after its unmount (its last
// uploads); the supervisor's unmounting phase is budgeted from it.
inline constexpr std::chrono::milliseconds kFuseExitWait{60'000};

struct MountOptions {
  std::string dataset_disk, dataset_dir = "/mnt/dataset", dataset_options;
  // Added to "the disk did not appear" (issue #30): why it may not be there
  // (a regional group puts its VM in any zone; a zonal disk is in one).
  std::string missing_disk_hint;
  std::string scratch_disk, scratch_dir = "/mnt/scratch";
  std::string bucket_mount;          // empty: no FUSE mount
  std::string bucket;                // gs://BUCKET[/PREFIX] (the bucket is mounted whole)
  std::string driver = "gcsfuse";    // gcsfuse | rclone
  std::vector<std::string> extra_args;  // mount-options, split on whitespace
  std::string storage_endpoint;      // as resolved (STORAGE_EMULATOR_HOST applied)
  bool storage_auth = true;          // false with STORAGE_EMULATOR_HOST: anonymous
  std::optional<UserInfo> owner;     // the trainer's user: owns the FUSE files, a new scratch fs
  std::vector<std::string> base_env;  // environment the FUSE daemon starts from
  std::chrono::milliseconds timeout{60'000};  // per step: a device to appear, a FUSE mount to be ready
  std::chrono::milliseconds unmount_timeout = kFuseExitWait;  // the FUSE daemon's exit (its last uploads)
  std::string by_id_dir = "/dev/disk/by-id";
  // Created (owned by `owner`) after the mounts, as they may live on one.
  std::vector<std::string> dirs_after_mount;
  // Checks the bucket exists and may be read before it is mounted (the API).
  std::function<Status()> check_bucket;

};

// The command line that mounts the bucket, without the binary's own path
// resolution: {"gcsfuse", "--foreground", ...}. Environment additions come
// back in `env` (rclone's remote is defined through RCLONE_CONFIG_*).
StatusOr<std::vector<std::string>> FuseCommand(const MountOptions& o, std::vector<std::string>& env);

class MountManager {
 public:
  MountManager(MountOptions options, Mounter& mounter, ChildRegistry& children, const Clock& clock, Logger& logger);
  ~MountManager();

  // Stops at the first failure; what was mounted until then stays recorded
  // for UnmountAll.
  Status MountAll();
  // Reverse order; never gives up half-way: a busy mount is detached lazily.
  // Returns the problems (empty: all clean).
  std::vector<std::string> UnmountAll();

  pid_t fuse_pid() const { return fuse_pid_.load(); }
  // Called on the reaping thread when the FUSE daemon exits.
  void set_on_fuse_exit(std::function<void(pid_t, int)> f) { on_fuse_exit_ = std::move(f); }
  bool unmounting() const { return unmounting_.load(); }
  // Thread-safe: cuts MountAll's waits short and stops it before its next
  // step (the mounting phase ran out of time). Unmounting is not affected.
  void Cancel();

 private:
  struct Mounted {
    std::string what;  // "dataset", "scratch", "bucket"
    std::string dir;
    bool ours = true;  // false: was already mounted; left alone at the end
  };
  struct FoundDisk {
    std::string device;
    bool reused = false;
  };
  StatusOr<FoundDisk> FindDisk(const char* what, const std::string& disk, const std::string& dir);
  Status MountDataset();
  Status MountScratch();
  Status MountBucket();
  bool IsOurBucketMount(const MountEntry& e) const;
  Status PrepareMountPoint(const std::string& dir);
  // What is mounted at dir now, if anything.
  StatusOr<std::optional<MountEntry>> At(const std::string& dir);
  Status WaitUntilMounted(const std::string& dir, pid_t pid);
  void Event(Severity s, const char* event, const std::string& message, nlohmann::json fields = nlohmann::json::object());
  std::string FuseTail();

  MountOptions o_;
  Mounter& mounter_;
  ChildRegistry& children_;
  const Clock& clock_;
  CancellableSleeper sleeper_;          // MountAll's waits; Cancel() cuts them
  CancellableSleeper unmount_sleeper_;  // UnmountAll's (never cancelled)
  std::atomic<bool> cancelled_{false};
  Logger& logger_;
  std::vector<Mounted> mounted_;
  std::atomic<pid_t> fuse_pid_{0};
  std::atomic<bool> unmounting_{false};
  std::function<void(pid_t, int)> on_fuse_exit_;
  std::thread fuse_reader_;
  std::mutex tail_mu_;
  std::vector<std::string> fuse_tail_;  // its last output lines, for error messages
};

}  // namespace spotvisor
