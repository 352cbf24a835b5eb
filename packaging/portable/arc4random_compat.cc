// Linked into the packaged binary only (SPOTVISOR_PORTABLE, with -Wl,--wrap=arc4random).
//
// GCC 12's static libstdc++ calls arc4random() from random.o (std::random_device), which
// glibc only has since 2.36; Ubuntu 22.04, the oldest image spotvisor's package targets, has
// glibc 2.35. spotvisor itself does not use std::random_device (lib/common/random.cc), but
// random.o is still linked in: libstdc++'s cow-string-inst.o (the old-ABI string
// instantiations, which the static link pulls in) refers to std::random_device::_M_init.
// --wrap=arc4random sends that one reference here instead, so the binary needs no
// GLIBC_2.36 symbol. Same contract as arc4random: a uniformly random 32-bit value from the
// kernel's CSPRNG; it never fails (getrandom(2) blocks only until the pool is initialised at
// boot, which is what arc4random does too). packaging/check-glibc.sh checks the symbol versions.
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" std::uint32_t __wrap_arc4random(void) {
  std::uint32_t value;
  for (;;) {
    ssize_t n = getrandom(&value, sizeof value, 0);
    if (n == static_cast<ssize_t>(sizeof value)) return value;
    if (n < 0 && errno != EINTR) std::abort();  // Only ENOSYS (kernel < 3.17) or EFAULT: no.
  }
}
