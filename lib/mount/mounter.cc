#include "mount/mounter.h"

#include <blkid/blkid.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstring>
#include <map>

#include <fmt/format.h>

namespace spotvisor {
namespace {

std::string MountErrorHint(int err, const std::string& fstype) {
  switch (err) {
    case EBUSY: return " (already mounted, or the device is in use)";
    case EINVAL: return " (the filesystem or an option is not valid for " + fstype + ")";
    case ENODEV: return " (the kernel does not support " + fstype + ")";
    case EROFS: return " (the device is read-only: mount it with ro)";
    case EACCES: return " (the device is read-only: mount it with ro)";
    case EPERM: return " (mounting needs root / CAP_SYS_ADMIN)";
    default: return "";
  }
}

class SystemMounter : public Mounter {
 public:
  StatusOr<Probe> ProbeDevice(const std::string& device) override {
    blkid_probe pr = blkid_new_probe_from_filename(device.c_str());
    if (pr == nullptr) return ErrnoToStatus(errno ? errno : EIO, "cannot open " + device + " to look for a filesystem");
    blkid_probe_enable_superblocks(pr, 1);
    blkid_probe_set_superblocks_flags(pr, BLKID_SUBLKS_TYPE | BLKID_SUBLKS_LABEL);
    blkid_probe_enable_partitions(pr, 1);
    Probe p;
    int r = blkid_do_safeprobe(pr);
    if (r == -2) {
      blkid_free_probe(pr);
      return FailedPreconditionError(device + ": more than one filesystem signature found; refusing to guess");
    }
    if (r < 0) {
      blkid_free_probe(pr);
      return InternalError(device + ": probing for a filesystem failed");
    }
    if (r == 0) {
      const char* v = nullptr;
      if (blkid_probe_lookup_value(pr, "TYPE", &v, nullptr) == 0) p.fstype = v;
      if (blkid_probe_lookup_value(pr, "PTTYPE", &v, nullptr) == 0) p.pttype = v;
      if (blkid_probe_lookup_value(pr, "LABEL", &v, nullptr) == 0) p.label = v;
    }
    blkid_free_probe(pr);
    return p;
  }

  Status Mount(const std::string& source, const std::string& target, const std::string& fstype,
               const MountFlags& f) override {
    if (mount(source.c_str(), target.c_str(), fstype.c_str(), f.flags, f.data.empty() ? nullptr : f.data.c_str()) != 0) {
      int err = errno;
      return ErrnoToStatus(err, fmt::format("mount {} on {} (type {}{}{}){}", source, target, fstype,
                                            f.data.empty() ? "" : ", options ", f.data, MountErrorHint(err, fstype)));
    }
    return OkStatus();
  }

  Status Unmount(const std::string& target, bool lazy) override {
    if (umount2(target.c_str(), lazy ? MNT_DETACH : 0) != 0) {
      return ErrnoToStatus(errno, fmt::format("{}unmount {}", lazy ? "lazy " : "", target));
    }
    return OkStatus();
  }

  StatusOr<std::vector<MountEntry>> Table() override { return ReadMountInfo(); }
};

}  // namespace

StatusOr<MountFlags> ParseMountOptions(const std::string& options) {
  static const std::map<std::string, std::pair<unsigned long, bool>> kFlags = {
      // name -> (flag, set?)
      {"ro", {MS_RDONLY, true}},         {"rw", {MS_RDONLY, false}},       {"nosuid", {MS_NOSUID, true}},
      {"suid", {MS_NOSUID, false}},      {"nodev", {MS_NODEV, true}},      {"dev", {MS_NODEV, false}},
      {"noexec", {MS_NOEXEC, true}},     {"exec", {MS_NOEXEC, false}},     {"sync", {MS_SYNCHRONOUS, true}},
      {"async", {MS_SYNCHRONOUS, false}}, {"noatime", {MS_NOATIME, true}}, {"atime", {MS_NOATIME, false}},
      {"nodiratime", {MS_NODIRATIME, true}}, {"relatime", {MS_RELATIME, true}}, {"strictatime", {MS_STRICTATIME, true}},
      {"dirsync", {MS_DIRSYNC, true}},   {"lazytime", {MS_LAZYTIME, true}}, {"defaults", {0, true}},
  };
  MountFlags out;
  std::string_view rest = options;
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string opt(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    if (opt.empty()) continue;
    if (opt.find_first_of(" \t\n") != std::string::npos) {
      return InvalidArgumentError(fmt::format("mount option \"{}\" contains whitespace", opt));
    }
    if (auto it = kFlags.find(opt); it != kFlags.end()) {
      if (it->second.second) {
        out.flags |= it->second.first;
      } else {
        out.flags &= ~it->second.first;
      }
      continue;
    }
    if (opt == "remount" || opt == "bind" || opt == "rbind" || opt == "move") {
      return InvalidArgumentError(fmt::format("mount option \"{}\" is not allowed here", opt));
    }
    out.data += (out.data.empty() ? "" : ",") + opt;
  }
  return out;
}

std::unique_ptr<Mounter> MakeSystemMounter() { return std::make_unique<SystemMounter>(); }

}  // namespace spotvisor
