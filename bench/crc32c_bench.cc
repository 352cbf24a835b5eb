// crc32c throughput on this machine, side by side: the byte table, the
// SSE4.2 instruction in one dependency chain (what spotvisor used before
// issue #15), and three interleaved chains (what Crc32cExtend uses now).
//   build-release/bench/crc32c_bench [MiB=256] [rounds=5]
// Prints GB/s (10^9 bytes per second, best of `rounds`) and ratios; checks
// that all three agree.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <random>
#include <string>

#include "storage/crc32c.h"

namespace {

template <typename F>
double BestGbPerS(const std::string& data, int rounds, F f, std::uint32_t* out) {
  double best = 0;
  for (int r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    *out = f(0, data);
    std::chrono::duration<double> s = std::chrono::steady_clock::now() - t0;
    best = std::max(best, static_cast<double>(data.size()) / s.count() / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t mib = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 256;
  int rounds = argc > 2 ? std::atoi(argv[2]) : 5;
  std::string data(mib << 20, '\0');
  std::mt19937_64 rng(1);
  for (std::size_t i = 0; i + 8 <= data.size(); i += 8) {
    auto v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  using spotvisor::internal::Crc32cExtendSse42;
  using spotvisor::internal::Crc32cExtendSse42x3;
  using spotvisor::internal::Crc32cExtendTable;
  std::uint32_t table_crc = 0, one_crc = 0, three_crc = 0;
  double table = BestGbPerS(data.substr(0, std::min<std::size_t>(data.size(), 64u << 20)), 1, Crc32cExtendTable,
                            &table_crc);
  if (!spotvisor::internal::CpuHasSse42()) {
    std::printf("no SSE4.2 on this CPU: table only, %.2f GB/s\n", table);
    return 0;
  }
  double one = BestGbPerS(data, rounds, Crc32cExtendSse42, &one_crc);
  double three = BestGbPerS(data, rounds, Crc32cExtendSse42x3, &three_crc);
  if (one_crc != three_crc || table_crc != Crc32cExtendSse42(0, data.substr(0, std::min<std::size_t>(data.size(), 64u << 20)))) {
    std::fprintf(stderr, "crc32c_bench: the implementations disagree\n");
    return 1;
  }
  std::printf("crc32c over %zu MiB, best of %d (GB/s = 10^9 B/s):\n", mib, rounds);
  std::printf("  %-28s %7.2f GB/s\n", "table (one byte a step)", table);
  std::printf("  %-28s %7.2f GB/s\n", "sse4.2, 1 chain (before)", one);
  std::printf("  %-28s %7.2f GB/s   %.2fx one chain\n", "sse4.2, 3 chains (now)", three, three / one);
  return 0;
}
