// Finding a GCE disk by the device name given at instance creation
// (`--disk=...,device-name=NAME`), never by /dev/sdX (those change).
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/status.h"
#include "retry/sleeper.h"

namespace spotvisor {

inline constexpr char kDiskByIdDir[] = "/dev/disk/by-id";

// Where NAME may appear under by_id_dir, in order: GCE's udev rules
// (google-NAME), then the kernel's own names for a SCSI persistent disk, a
// SCSI local SSD and NVMe persistent disks, so images without Google's guest
// packages work too. An absolute /dev/... path is taken as it is.
std::vector<std::string> DeviceCandidates(const std::string& name, const std::string& by_id_dir = kDiskByIdDir);

struct DeviceWait {
  std::string name;
  std::chrono::milliseconds timeout{60'000};
  std::chrono::milliseconds poll{250};
  std::string by_id_dir = kDiskByIdDir;
};

// Waits (udev can be late at boot) until a candidate exists as a block
// device; returns its path. NotFound names every path that was looked for.
// `on_waiting` is called once, if the first look finds nothing.
StatusOr<std::string> WaitForDevice(const DeviceWait& w, const Clock& clock, Sleeper& sleeper,
                                    const std::function<void(const std::vector<std::string>&)>& on_waiting = {});

}  // namespace spotvisor
