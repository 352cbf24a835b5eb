// A seed from the kernel's CSPRNG (getrandom(2)), for jitter and multipart
// boundaries. Not std::random_device: with a static libstdc++ (the packaged
// binary) it needs arc4random, which glibc has only since 2.36, and the
// package supports glibc 2.35 (docs/packaging.md).
#pragma once

#include <cstdint>

namespace spotvisor {

std::uint64_t RandomSeed();

}  // namespace spotvisor
