#include "common/random.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

namespace spotvisor {

std::uint64_t RandomSeed() {
  std::uint64_t value = 0;
  for (;;) {
    ssize_t n = getrandom(&value, sizeof value, GRND_NONBLOCK);
    if (n == static_cast<ssize_t>(sizeof value)) return value;
    if (n < 0 && errno == EINTR) continue;
    // Entropy pool not ready this early at boot (EAGAIN), or no getrandom:
    // jitter does not need cryptographic quality.
    return static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<std::uint64_t>(getpid()) << 32);
  }
}

}  // namespace spotvisor
