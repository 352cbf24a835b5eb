// The service manager as an I/O boundary: sd_notify(3) messages to systemd
// (READY=1, STATUS=, STOPPING=1, WATCHDOG=1, EXTEND_TIMEOUT_USEC=) over the
// datagram socket systemd names in NOTIFY_SOCKET.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"

namespace spotvisor {

class ServiceNotifier {
 public:
  virtual ~ServiceNotifier() = default;
  // One message, newline-separated assignments ("READY=1\nSTATUS=running").
  virtual Status Notify(const std::string& message) = 0;
  // systemd's watchdog interval for this process (WatchdogSec=), if enabled.
  virtual std::optional<std::chrono::microseconds> WatchdogInterval() const = 0;
};

// The real one, through libsystemd; null when NOTIFY_SOCKET is not set (not
// started by systemd, or Type= is not notify).
std::unique_ptr<ServiceNotifier> MakeSystemdNotifier();

}  // namespace spotvisor
