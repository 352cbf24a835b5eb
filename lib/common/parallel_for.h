// Runs fn(i) for i in [0, n) on up to `parallelism` threads, this one
// included; returns the first error. After an error no new item starts (the
// others finish the one they are on). Used by the sync engine (files at
// once) and the Cloud Storage client (parts and ranges at once).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "common/status.h"

namespace spotvisor {

template <typename Fn>
Status ParallelFor(std::size_t n, int parallelism, Fn fn) {
  std::atomic<std::size_t> next{0};
  std::mutex mu;
  Status first;
  auto work = [&] {
    for (std::size_t i; (i = next++) < n;) {
      {
        std::lock_guard lk(mu);
        if (!first.ok()) return;
      }
      Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard lk(mu);
        if (first.ok()) first = s;
      }
    }
  };
  std::vector<std::thread> threads;
  int count = static_cast<int>(std::min<std::size_t>(n, static_cast<std::size_t>(std::max(1, parallelism))));
  for (int t = 1; t < count; ++t) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  return first;
}

}  // namespace spotvisor
