#include "mount/mount_manager.h"

#include <dirent.h>
#include <poll.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "common/duration.h"
#include "common/strings.h"
#include "mount/devices.h"

namespace spotvisor {
namespace {

// ext4 labels hold 16 bytes at most.
constexpr char kScratchLabel[] = "sv-scratch";
constexpr char kDefaultStorageEndpoint[] = "https://storage.googleapis.com";

// stat() on a FUSE mount whose daemon is gone: ENOTCONN, or ECONNABORTED
// once the kernel has aborted the connection.
bool IsDeadFuse(int err) { return err == ENOTCONN || err == ECONNABORTED; }

double SecondsSince(const Clock& clock, SteadyTime t0) { return std::chrono::duration<double>(clock.Now() - t0).count(); }

std::string BucketName(const std::string& bucket) {
  if (bucket.rfind("gs://", 0) != 0) return "";
  auto rest = bucket.substr(5);
  return rest.substr(0, rest.find('/'));
}

bool OnPath(const std::string& binary, const std::vector<std::string>& env) {
  if (binary.find('/') != std::string::npos) return access(binary.c_str(), X_OK) == 0;
  std::string path = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
  for (auto const& e : env) {
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  }
  std::string_view rest = path;
  while (true) {
    auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (!dir.empty() && access((dir + "/" + binary).c_str(), X_OK) == 0) return true;
    if (colon == std::string_view::npos) return false;
    rest.remove_prefix(colon + 1);
  }
}

}  // namespace

StatusOr<std::vector<std::string>> FuseCommand(const MountOptions& o, std::vector<std::string>& env) {
  std::string bucket = BucketName(o.bucket);
  if (bucket.empty()) return InvalidArgumentError("bucket-mount needs bucket = gs://BUCKET[/PREFIX]");
  std::string uid = o.owner ? std::to_string(o.owner->uid) : std::to_string(getuid());
  std::string gid = o.owner ? std::to_string(o.owner->gid) : std::to_string(getgid());
  bool custom = !o.storage_endpoint.empty() && o.storage_endpoint != kDefaultStorageEndpoint;
  std::vector<std::string> argv;
  if (o.driver == "gcsfuse") {
    // --foreground: gcsfuse stays our child (it would daemonize otherwise)
    // and readiness is the mount appearing in mountinfo.
    argv = {"gcsfuse", "--foreground", "--implicit-dirs", "--uid", uid, "--gid", gid,
            "--file-mode", "644", "--dir-mode", "755", "-o", "allow_other"};
    if (custom) argv.insert(argv.end(), {"--custom-endpoint", o.storage_endpoint + "/storage/v1/"});
    if (!o.storage_auth) argv.push_back("--anonymous-access");
  } else if (o.driver == "rclone") {
    // The remote is defined in the environment, not in a config file.
    env.push_back("RCLONE_CONFIG_SPOTVISORGCS_TYPE=google cloud storage");
    env.push_back("RCLONE_CONFIG_SPOTVISORGCS_BUCKET_POLICY_ONLY=true");
    env.push_back(o.storage_auth ? "RCLONE_CONFIG_SPOTVISORGCS_ENV_AUTH=true" : "RCLONE_CONFIG_SPOTVISORGCS_ANONYMOUS=true");
    // rclone wants the JSON API base, as gcsfuse does.
    if (custom) env.push_back("RCLONE_CONFIG_SPOTVISORGCS_ENDPOINT=" + o.storage_endpoint + "/storage/v1/");
    // No VFS cache: a file is uploaded while it is written and close()
    // returns once the object exists (or with the error), as with gcsfuse.
    // With the write cache, rclone uploads after close() and, when it is
    // unmounted, exits without waiting for pending uploads (measured: exits
    // within 15 ms, the upload stays in its cache dir), so the last files
    // written before the unmount would not be in the bucket. The price:
    // files under the mount are written sequentially (no seek, no
    // read+write); mount-options = --vfs-cache-mode writes overrides it.
    argv = {"rclone", "mount", "spotvisorgcs:" + bucket, o.bucket_mount, "--uid", uid, "--gid", gid,
            "--allow-other", "--dir-perms", "0755", "--file-perms", "0644", "--vfs-cache-mode", "off"};
  } else {
    return InvalidArgumentError("mount-driver must be gcsfuse or rclone, not \"" + o.driver + "\"");
  }
  argv.insert(argv.end(), o.extra_args.begin(), o.extra_args.end());
  if (o.driver == "gcsfuse") argv.insert(argv.end(), {bucket, o.bucket_mount});
  return argv;
}

MountManager::MountManager(MountOptions options, Mounter& mounter, ChildRegistry& children, const Clock& clock,
                           Logger& logger)
    : o_(std::move(options)), mounter_(mounter), children_(children), clock_(clock), logger_(logger) {}

void MountManager::Cancel() {
  cancelled_ = true;
  sleeper_.Cancel();
}

MountManager::~MountManager() {
  if (fuse_reader_.joinable()) fuse_reader_.join();
}

void MountManager::Event(Severity s, const char* event, const std::string& message, nlohmann::json fields) {
  logger_.Log(LogEvent{s, event, message, std::move(fields)});
}

Status MountManager::PrepareMountPoint(const std::string& dir) {
  auto s = MakeDirs(dir, std::nullopt);
  if (!s.ok() && s.code() != StatusCode::kFailedPrecondition) {  // FailedPrecondition: exists, not a directory
    // A stale FUSE mount fails stat with ENOTCONN; that is dealt with later.
    struct stat st;
    if (stat(dir.c_str(), &st) != 0 && IsDeadFuse(errno)) return OkStatus();
  }
  return s;
}

StatusOr<std::optional<MountEntry>> MountManager::At(const std::string& dir) {
  auto table = mounter_.Table();
  if (!table.ok()) return table.status();
  return FindMountAt(*table, dir);
}

Status MountManager::MountAll() {
  for (auto [disk, fn] : {std::pair{&o_.dataset_disk, &MountManager::MountDataset},
                          std::pair{&o_.scratch_disk, &MountManager::MountScratch},
                          std::pair{&o_.bucket_mount, &MountManager::MountBucket}}) {
    if (disk->empty()) continue;
    if (cancelled_) return CancelledError("mounting was cancelled (out of time)");
    if (auto s = (this->*fn)(); !s.ok()) return s;
  }
  for (auto const& d : o_.dirs_after_mount) {
    if (auto s = MakeDirs(d, o_.owner); !s.ok()) return s;
  }
  return OkStatus();
}

// The disk named `disk` (waited for), and what is mounted on `dir` now: the
// same disk (reused, recorded as not ours) or nothing; anything else is an
// error.
StatusOr<MountManager::FoundDisk> MountManager::FindDisk(const char* what, const std::string& disk, const std::string& dir) {
  DeviceWait w{disk, o_.timeout, std::chrono::milliseconds(250), o_.by_id_dir};
  auto device = WaitForDevice(w, clock_, sleeper_, [&](const std::vector<std::string>& looked) {
    Event(Severity::kInfo, "mount.waiting",
          fmt::format("waiting up to {} for the {} disk \"{}\" to appear", FormatDuration(o_.timeout), what, disk),
          {{"what", what}, {"disk", disk}, {"looked_for", looked}});
  });
  if (!device.ok()) {
    if (device.status().code() == StatusCode::kNotFound && !o_.missing_disk_hint.empty()) {
      return Status(device.status().code(), device.status().message() + ". " + o_.missing_disk_hint);
    }
    return device.status();
  }
  if (auto s = PrepareMountPoint(dir); !s.ok()) return s;
  struct stat dev_st;
  if (stat(device->c_str(), &dev_st) != 0) return ErrnoToStatus(errno, "stat " + *device);
  auto existing = At(dir);
  if (!existing.ok()) return existing.status();
  if (!*existing) return FoundDisk{*device, false};
  auto const& e = **existing;
  if (e.major != major(dev_st.st_rdev) || e.minor != minor(dev_st.st_rdev)) {
    return FailedPreconditionError(fmt::format("{} already has {} ({}) mounted on it, not the {} disk {}: refusing to mount "
                                               "over it",
                                               dir, e.source, e.fstype, what, *device));
  }
  mounted_.push_back({what, dir, false});
  Event(Severity::kInfo, "mount.reused",
        fmt::format("the {} disk {} is already mounted on {} ({}, {}): using it as it is", what, *device, dir, e.fstype,
                    e.read_only() ? "read-only" : "read-write"),
        {{"what", what}, {"device", *device}, {"dir", dir}, {"fstype", e.fstype}});
  return FoundDisk{*device, true};
}

Status MountManager::MountDataset() {
  auto t0 = clock_.Now();
  for (auto const& opt : SplitOn(o_.dataset_options, ',')) {
    if (opt == "rw") return InvalidArgumentError("dataset-mount-options: the dataset disk is always mounted read-only (drop \"rw\")");
  }
  auto user_flags = ParseMountOptions(o_.dataset_options);
  if (!user_flags.ok()) return InvalidArgumentError("dataset-mount-options: " + user_flags.status().message());
  auto found = FindDisk("dataset", o_.dataset_disk, o_.dataset_dir);
  if (!found.ok()) return found.status();
  if (found->reused) return OkStatus();
  auto const* device = &found->device;
  auto probe = mounter_.ProbeDevice(*device);
  if (!probe.ok()) return probe.status();
  if (probe->fstype == "swap" || probe->fstype.find("_member") != std::string::npos || probe->fstype == "crypto_LUKS") {
    // blkid reports these as TYPE, but there is nothing to mount.
    return FailedPreconditionError(fmt::format("the dataset disk {} holds {}, not a filesystem that can be mounted",
                                               *device, probe->fstype));
  }
  if (probe->fstype.empty()) {
    if (!probe->pttype.empty()) {
      return FailedPreconditionError(fmt::format(
          "the dataset disk {} has a partition table ({}) and no filesystem on the whole disk: set dataset-disk to the "
          "partition, e.g. {}-part1",
          *device, probe->pttype, *device));
    }
    return FailedPreconditionError(
        fmt::format("the dataset disk {} has no filesystem (spotvisor never formats a dataset disk)", *device));
  }
  // A disk attached read-only (shared by several VMs) cannot replay its
  // journal: mount without recovery, read-only.
  std::string recovery;
  if (probe->fstype == "ext3" || probe->fstype == "ext4") recovery = "noload";
  if (probe->fstype == "xfs") recovery = "norecovery";
  MountFlags flags = *user_flags;
  flags.flags |= MS_RDONLY;
  if (!recovery.empty()) flags.data = recovery + (flags.data.empty() ? "" : "," + flags.data);
  if (cancelled_) return CancelledError("mounting was cancelled (out of time)");
  if (auto s = mounter_.Mount(*device, o_.dataset_dir, probe->fstype, flags); !s.ok()) return s;
  mounted_.push_back({"dataset", o_.dataset_dir, true});
  Event(Severity::kInfo, "mount.done",
        fmt::format("dataset disk {} ({}) mounted read-only on {}", *device, probe->fstype, o_.dataset_dir),
        {{"what", "dataset"}, {"device", *device}, {"dir", o_.dataset_dir}, {"fstype", probe->fstype},
         {"options", "ro" + (flags.data.empty() ? "" : "," + flags.data)}, {"duration_s", SecondsSince(clock_, t0)}});
  return OkStatus();
}

Status MountManager::MountScratch() {
  auto t0 = clock_.Now();
  auto found = FindDisk("scratch", o_.scratch_disk, o_.scratch_dir);
  if (!found.ok()) return found.status();
  if (found->reused) return OkStatus();
  auto const* device = &found->device;
  auto probe = mounter_.ProbeDevice(*device);
  if (!probe.ok()) return probe.status();
  bool formatted = false;
  if (probe->blank()) {
    Event(Severity::kInfo, "mount.formatting", fmt::format("the scratch disk {} is blank: formatting it ext4", *device),
          {{"what", "scratch"}, {"device", *device}});
    std::string output;
    SpawnOptions so;
    so.argv = {"mkfs.ext4", "-F", "-q", "-m", "0", "-L", kScratchLabel, *device};
    so.env = o_.base_env;
    auto r = children_.Run(so, std::chrono::minutes(10), &output, &cancelled_);
    if (!r.ok()) return Status(r.status().code(), "formatting the scratch disk: " + r.status().message());
    if (!WIFEXITED(*r) || WEXITSTATUS(*r) != 0) {
      return InternalError(fmt::format("mkfs.ext4 {} {}: {}", *device, DescribeWaitStatus(*r), std::string(Trim(output))));
    }
    formatted = true;
    probe = mounter_.ProbeDevice(*device);
    if (!probe.ok()) return probe.status();
  } else if (probe->label != kScratchLabel) {
    // Someone's data, or the wrong disk: never format it, never write to it.
    return FailedPreconditionError(fmt::format(
        "the scratch disk {} already has {} that spotvisor did not create (label \"{}\"): not formatting it and not "
        "using it; wipe it (wipefs -a) if it really is scratch space",
        *device, probe->fstype.empty() ? "a partition table (" + probe->pttype + ")" : "a filesystem (" + probe->fstype + ")",
        probe->label));
  }
  MountFlags flags;
  flags.flags = MS_NOATIME;
  flags.data = "discard";
  if (cancelled_) return CancelledError("mounting was cancelled (out of time)");
  if (auto s = mounter_.Mount(*device, o_.scratch_dir, probe->fstype, flags); !s.ok()) return s;
  mounted_.push_back({"scratch", o_.scratch_dir, true});
  if (formatted && o_.owner && geteuid() == 0 && chown(o_.scratch_dir.c_str(), o_.owner->uid, o_.owner->gid) != 0) {
    return ErrnoToStatus(errno, fmt::format("cannot give {} to user {}", o_.scratch_dir, o_.owner->name));
  }
  Event(Severity::kInfo, "mount.done",
        fmt::format("scratch disk {} ({}{}) mounted on {}", *device, probe->fstype, formatted ? ", newly formatted" : "",
                    o_.scratch_dir),
        {{"what", "scratch"}, {"device", *device}, {"dir", o_.scratch_dir}, {"fstype", probe->fstype},
         {"formatted", formatted}, {"duration_s", SecondsSince(clock_, t0)}});
  return OkStatus();
}

// A mount this configuration would have made: the same driver's FUSE type
// and the same bucket as its source.
bool MountManager::IsOurBucketMount(const MountEntry& e) const {
  std::string bucket = BucketName(o_.bucket);
  if (o_.driver == "rclone") {
    // rclone names the source REMOTE:BUCKET, with a {hash} after the remote
    // when its options come from the environment: spotvisorgcs{beGLi}:BUCKET.
    const std::string remote = "spotvisorgcs", tail = ":" + bucket;
    if (e.fstype != "fuse.rclone" || e.source.rfind(remote, 0) != 0 || e.source.size() < remote.size() + tail.size() ||
        e.source.compare(e.source.size() - tail.size(), tail.size(), tail) != 0) {
      return false;
    }
    auto middle = e.source.substr(remote.size(), e.source.size() - remote.size() - tail.size());
    return middle.empty() || (middle.front() == '{' && middle.back() == '}' && middle.find_first_of(":/") == std::string::npos);
  }
  return (e.fstype == "fuse.gcsfuse" || e.fstype == "fuse") && e.source == bucket;
}

Status MountManager::MountBucket() {
  auto t0 = clock_.Now();
  std::vector<std::string> env = o_.base_env;
  auto argv = FuseCommand(o_, env);
  if (!argv.ok()) return argv.status();
  if (!OnPath((*argv)[0], env)) {
    return NotFoundError(o_.driver == "gcsfuse"
                             ? std::string("gcsfuse is not installed (not on PATH): install it from Google's apt "
                                           "repository (docs/quickstart.md), or set mount-driver = rclone")
                             : std::string("rclone is not installed (not on PATH): apt-get install rclone fuse3"));
  }
  if (o_.check_bucket) {
    if (auto s = o_.check_bucket(); !s.ok()) return Status(s.code(), "cannot mount the bucket: " + s.message());
  }
  if (auto s = PrepareMountPoint(o_.bucket_mount); !s.ok()) return s;
  auto existing = At(o_.bucket_mount);
  if (!existing.ok()) return existing.status();
  if (*existing) {
    struct stat st;
    if (stat(o_.bucket_mount.c_str(), &st) != 0 && IsDeadFuse(errno)) {
      // The FUSE daemon of an earlier spotvisor died with it.
      Event(Severity::kWarning, "mount.stale",
            fmt::format("{} is a dead FUSE mount ({}) left by an earlier run: detaching it", o_.bucket_mount, (*existing)->fstype),
            {{"what", "bucket"}, {"dir", o_.bucket_mount}});
      if (auto s = mounter_.Unmount(o_.bucket_mount, true); !s.ok()) return s;
    } else if (IsOurBucketMount(**existing)) {
      // The same bucket by the same driver, still served: the driver of a
      // spotvisor that was killed (kill -9, a crash) outlived it. Restarting
      // must not fail the run (and power the VM off) over it: detach it (the
      // driver exits once its mount is gone) and mount afresh.
      Event(Severity::kWarning, "mount.stale",
            fmt::format("{} is still mounted ({} {}) by the driver of an earlier run: detaching it and mounting afresh",
                        o_.bucket_mount, (*existing)->fstype, (*existing)->source),
            {{"what", "bucket"}, {"dir", o_.bucket_mount}});
      if (auto s = mounter_.Unmount(o_.bucket_mount, true); !s.ok()) return s;
    } else {
      return FailedPreconditionError(fmt::format("{} already has {} ({}) mounted on it: refusing to mount the bucket over it",
                                                 o_.bucket_mount, (*existing)->source, (*existing)->fstype));
    }
  }
  SpawnOptions so;
  so.argv = *argv;
  so.env = env;
  so.capture_output = true;
  auto p = children_.Spawn(
      so,
      [this](int status) {
        pid_t pid = fuse_pid_.exchange(0);
        if (on_fuse_exit_) on_fuse_exit_(pid, status);
      },
      [this](pid_t pid) { fuse_pid_ = pid; });
  if (!p.ok()) return Status(p.status().code(), fmt::format("starting {}: {}", o_.driver, p.status().message()));
  Event(Severity::kInfo, "mount.fuse_start",
        fmt::format("started {} (pid {}) to mount {} on {}", o_.driver, p->pid, BucketName(o_.bucket), o_.bucket_mount),
        {{"what", "bucket"}, {"driver", o_.driver}, {"pid", p->pid}, {"argv", *argv}});
  int out_fd = p->stdout_fd, err_fd = p->stderr_fd;
  fuse_reader_ = std::thread([this, out_fd, err_fd] {
    pollfd fds[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    std::string partial[2];
    int open_fds = 2;
    while (open_fds > 0) {
      if (poll(fds, 2, -1) < 0) {
        if (errno == EINTR) continue;
        break;
      }
      for (int i = 0; i < 2; ++i) {
        if (fds[i].fd < 0 || fds[i].revents == 0) continue;
        char buf[4096];
        ssize_t n = read(fds[i].fd, buf, sizeof buf);
        if (n <= 0) {
          if (n < 0 && errno == EINTR) continue;
          close(fds[i].fd);
          fds[i].fd = -1;
          --open_fds;
          n = 0;
        }
        partial[i].append(buf, static_cast<std::size_t>(n));
        std::size_t nl;
        while ((nl = partial[i].find('\n')) != std::string::npos || (fds[i].fd < 0 && !partial[i].empty())) {
          std::string line = partial[i].substr(0, nl);
          partial[i].erase(0, nl == std::string::npos ? std::string::npos : nl + 1);
          if (Trim(line).empty()) continue;
          if (line.size() > 2000) line.resize(2000);
          {
            std::lock_guard<std::mutex> l(tail_mu_);
            fuse_tail_.push_back(line);
            if (fuse_tail_.size() > 10) fuse_tail_.erase(fuse_tail_.begin());
          }
          Event(Severity::kInfo, "mount.output", line, {{"driver", o_.driver}, {"stream", i == 0 ? "stdout" : "stderr"}});
        }
      }
    }
  });
  if (auto s = WaitUntilMounted(o_.bucket_mount, p->pid); !s.ok()) {
    if (pid_t pid = fuse_pid_.load(); pid > 0) {
      killpg(pid, SIGTERM);
      if (!children_.Wait(pid, std::chrono::seconds(5))) killpg(pid, SIGKILL);
    }
    // It may have mounted just as it failed the check: never leave it behind.
    if (auto e = At(o_.bucket_mount); e.ok() && *e && (*e)->fstype.rfind("fuse", 0) == 0) {
      mounter_.Unmount(o_.bucket_mount, true);
    }
    return s;
  }
  mounted_.push_back({"bucket", o_.bucket_mount, true});
  Event(Severity::kInfo, "mount.done",
        fmt::format("bucket {} mounted on {} by {} (pid {})", BucketName(o_.bucket), o_.bucket_mount, o_.driver, p->pid),
        {{"what", "bucket"}, {"driver", o_.driver}, {"dir", o_.bucket_mount}, {"pid", p->pid},
         {"duration_s", SecondsSince(clock_, t0)}});
  return OkStatus();
}

std::string MountManager::FuseTail() {
  std::lock_guard<std::mutex> l(tail_mu_);
  std::string out;
  for (auto const& line : fuse_tail_) out += (out.empty() ? "" : " | ") + line;
  return out.empty() ? "(no output)" : out;
}

Status MountManager::WaitUntilMounted(const std::string& dir, pid_t pid) {
  auto deadline = clock_.Now() + o_.timeout;
  for (;;) {
    auto e = At(dir);
    if (!e.ok()) return e.status();
    if (*e && (*e)->fstype.rfind("fuse", 0) == 0) {
      // Mounted is not working: rclone mounts a bucket that does not exist,
      // or that it may not read, and fails only on the first listing.
      errno = 0;
      DIR* d = opendir(dir.c_str());
      int err = errno;
      if (d != nullptr) {
        errno = 0;
        readdir(d);
        err = errno;
        closedir(d);
      }
      if (d == nullptr || err != 0) {
        return UnavailableError(fmt::format("the bucket is mounted on {} but cannot be listed ({}): {}", dir,
                                            std::strerror(err), FuseTail()));
      }
      return OkStatus();
    }
    if (!children_.Registered(pid)) {
      // Give the reader a moment to take the last words (bounded).
      if (fuse_reader_.joinable()) fuse_reader_.join();
      return UnavailableError(fmt::format("{} exited before the bucket was mounted on {}: {}", o_.driver, dir, FuseTail()));
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_.Now());
    if (left.count() <= 0) {
      return DeadlineExceededError(fmt::format("{} did not mount the bucket on {} within {}: {}", o_.driver, dir,
                                               FormatDuration(o_.timeout), FuseTail()));
    }
    if (!sleeper_.SleepFor(std::min(left, std::chrono::milliseconds(100)))) return CancelledError("mounting the bucket");
  }
}

std::vector<std::string> MountManager::UnmountAll() {
  std::vector<std::string> problems;
  unmounting_ = true;
  for (auto it = mounted_.rbegin(); it != mounted_.rend(); ++it) {
    auto t0 = clock_.Now();
    if (!it->ours) {
      Event(Severity::kInfo, "mount.left", fmt::format("{} was mounted before spotvisor started: left mounted", it->dir),
            {{"what", it->what}, {"dir", it->dir}});
      continue;
    }
    pid_t fuse = it->what == "bucket" ? fuse_pid_.load() : 0;
    Status s = mounter_.Unmount(it->dir, false);
    // A process that is still exiting may hold it for a moment.
    for (int i = 0; !s.ok() && s.code() == StatusCode::kUnavailable && i < 20; ++i) {  // EBUSY
      unmount_sleeper_.SleepFor(std::chrono::milliseconds(250));
      s = mounter_.Unmount(it->dir, false);
    }
    bool lazy = false;
    if (!s.ok()) {
      bool gone = s.code() == StatusCode::kInvalidArgument;  // EINVAL: not mounted any more
      if (!gone) {
        lazy = true;
        Status l = mounter_.Unmount(it->dir, true);
        problems.push_back(fmt::format("{}: {}; {}", it->dir, s.message(), l.ok() ? "detached lazily" : l.message()));
        Event(Severity::kError, "mount.unmount_failed",
              fmt::format("cannot unmount {} ({}): {}", it->dir, s.message(), l.ok() ? "detached it lazily" : l.message()),
              {{"what", it->what}, {"dir", it->dir}, {"error", s.message()}});
      }
    }
    if (fuse > 0) {
      // gcsfuse uploads a file when it is closed; the daemon exits once it
      // has finished with the unmounted filesystem.
      auto status = children_.Wait(fuse, o_.unmount_timeout);
      if (!status) {
        problems.push_back(fmt::format("{} did not exit within {} of the unmount", o_.driver, FormatDuration(o_.unmount_timeout)));
        Event(Severity::kError, "mount.unmount_timeout",
              fmt::format("{} (pid {}) did not exit within {} of the unmount: its last uploads may be lost; stopping it",
                          o_.driver, fuse, FormatDuration(o_.unmount_timeout)),
              {{"what", "bucket"}, {"pid", fuse}});
        if (!lazy) mounter_.Unmount(it->dir, true);
        killpg(fuse, SIGTERM);
        if (!children_.Wait(fuse, std::chrono::seconds(5))) killpg(fuse, SIGKILL);
      } else if (!(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)) {
        Event(Severity::kWarning, "mount.fuse_exit", fmt::format("{} {} after the unmount", o_.driver, DescribeWaitStatus(*status)),
              {{"what", "bucket"}, {"pid", fuse}});
      }
      if (fuse_reader_.joinable()) fuse_reader_.join();
    }
    Event(Severity::kInfo, "mount.unmounted", fmt::format("{} unmounted ({})", it->dir, it->what),
          {{"what", it->what}, {"dir", it->dir}, {"lazy", lazy}, {"duration_s", SecondsSince(clock_, t0)}});
  }
  mounted_.clear();
  return problems;
}

}  // namespace spotvisor
