#include "mount/devices.h"

#include <sys/stat.h>

#include <fmt/format.h>

#include "common/duration.h"

namespace spotvisor {

std::vector<std::string> DeviceCandidates(const std::string& name, const std::string& by_id_dir) {
  if (name.rfind("/dev/", 0) == 0) return {name};
  return {
      by_id_dir + "/google-" + name,
      by_id_dir + "/scsi-0Google_PersistentDisk_" + name,
      by_id_dir + "/scsi-0Google_EphemeralDisk_" + name,
      by_id_dir + "/nvme-Google_PersistentDisk_" + name,
      by_id_dir + "/nvme-nvme_card-pd_" + name,
  };
}

StatusOr<std::string> WaitForDevice(const DeviceWait& w, const Clock& clock, Sleeper& sleeper,
                                    const std::function<void(const std::vector<std::string>&)>& on_waiting) {
  bool path = w.name.rfind("/dev/", 0) == 0;
  if (w.name.empty() || (!path && w.name.find('/') != std::string::npos)) {
    return InvalidArgumentError(fmt::format("\"{}\" is not a device name (or a /dev/... path)", w.name));
  }
  auto candidates = DeviceCandidates(w.name, w.by_id_dir);
  auto deadline = clock.Now() + w.timeout;
  bool told = false;
  for (;;) {
    for (auto const& c : candidates) {
      struct stat st;
      if (stat(c.c_str(), &st) == 0) {
        if (!S_ISBLK(st.st_mode)) return FailedPreconditionError(fmt::format("{} is not a block device", c));
        return c;
      }
    }
    if (!told && on_waiting) on_waiting(candidates);
    told = true;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock.Now());
    if (left.count() <= 0) break;
    if (!sleeper.SleepFor(std::min(left, w.poll))) return CancelledError("waiting for disk " + w.name);
  }
  std::string looked;
  for (auto const& c : candidates) looked += (looked.empty() ? "" : ", ") + c;
  return NotFoundError(fmt::format("disk \"{}\" did not appear within {} (looked for {}); is it attached with "
                                   "device-name={}?",
                                   w.name, FormatDuration(w.timeout), looked, w.name));
}

}  // namespace spotvisor
