// The kernel's mount table as an I/O boundary: probe a block device for a
// filesystem, mount(2), umount2(2), read mountinfo. Tests run the real one
// against loop devices inside a private mount namespace.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "mount/mountinfo.h"

namespace spotvisor {

struct Probe {
  std::string fstype;   // "ext4", "xfs"; empty: no filesystem found
  std::string pttype;   // a partition table ("gpt", "dos"), if any
  std::string label;
  bool blank() const { return fstype.empty() && pttype.empty(); }
};

// mount(8)-style options ("ro,noatime,noload") split into mount(2) flags and
// the filesystem-specific data string.
struct MountFlags {
  unsigned long flags = 0;
  std::string data;
};
StatusOr<MountFlags> ParseMountOptions(const std::string& options);

class Mounter {
 public:
  virtual ~Mounter() = default;
  virtual StatusOr<Probe> ProbeDevice(const std::string& device) = 0;
  virtual Status Mount(const std::string& source, const std::string& target, const std::string& fstype,
                       const MountFlags& flags) = 0;
  // lazy: MNT_DETACH (the mount goes once nothing uses it any more).
  virtual Status Unmount(const std::string& target, bool lazy) = 0;
  virtual StatusOr<std::vector<MountEntry>> Table() = 0;
};

std::unique_ptr<Mounter> MakeSystemMounter();

}  // namespace spotvisor
