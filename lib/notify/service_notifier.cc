#include "notify/service_notifier.h"

#include <systemd/sd-daemon.h>

#include <cstdlib>

namespace spotvisor {
namespace {

class SystemdNotifier : public ServiceNotifier {
 public:
  Status Notify(const std::string& message) override {
    int r = sd_notify(0, message.c_str());
    if (r < 0) return ErrnoToStatus(-r, "sd_notify");
    return OkStatus();
  }

  std::optional<std::chrono::microseconds> WatchdogInterval() const override {
    uint64_t usec = 0;
    // > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is us.
    if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return std::nullopt;
    return std::chrono::microseconds(usec);
  }
};

}  // namespace

std::unique_ptr<ServiceNotifier> MakeSystemdNotifier() {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  if (socket == nullptr || *socket == '\0') return nullptr;
  return std::make_unique<SystemdNotifier>();
}

}  // namespace spotvisor
