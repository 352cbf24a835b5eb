#include "retry/sleeper.h"

namespace spotvisor {

bool CancellableSleeper::SleepFor(std::chrono::milliseconds d) {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, d, [this] { return cancelled_; });
  return !cancelled_;
}

void CancellableSleeper::Cancel() {
  {
    std::lock_guard lk(mu_);
    cancelled_ = true;
  }
  cv_.notify_all();
}

bool CancellableSleeper::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

}  // namespace spotvisor
