#include "common/cancel.h"

#include <thread>
#include <vector>

namespace spotvisor {

void CancelSource::Cancel() {
  std::map<std::uint64_t, std::function<void()>> callbacks;
  {
    std::lock_guard lk(mu_);
    if (cancelled_) return;
    cancelled_ = true;
    callbacks.swap(callbacks_);
  }
  cv_.notify_all();
  for (auto& [id, fn] : callbacks) fn();
}

bool CancelSource::cancelled() const {
  std::lock_guard lk(mu_);
  return cancelled_;
}

bool CancelSource::WaitFor(std::chrono::milliseconds d) const {
  std::unique_lock lk(mu_);
  cv_.wait_for(lk, d, [this] { return cancelled_; });
  return !cancelled_;
}

std::uint64_t CancelSource::Subscribe(std::function<void()> fn) {
  {
    std::lock_guard lk(mu_);
    if (!cancelled_) {
      auto id = next_id_++;
      callbacks_.emplace(id, std::move(fn));
      return id;
    }
  }
  fn();
  return 0;
}

void CancelSource::Unsubscribe(std::uint64_t id) {
  std::lock_guard lk(mu_);
  callbacks_.erase(id);
}

std::chrono::milliseconds CallContext::Remaining(std::chrono::milliseconds cap) const {
  if (!deadline || !clock) return cap;
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - clock->Now());
  if (left.count() < 0) return std::chrono::milliseconds(0);
  return std::min(cap, left);
}

Status CallContext::Check(const std::string& what) const {
  if (cancelled()) return CancelledError(what + ": cancelled");
  if (expired()) return DeadlineExceededError(what + ": out of time");
  return OkStatus();
}

bool CallContext::SleepFor(std::chrono::milliseconds d) const {
  if (cancelled()) return false;
  if (deadline && clock && clock->Now() + d >= *deadline) return false;
  if (cancel) return cancel->WaitFor(d);
  std::this_thread::sleep_for(d);
  return true;
}

CallContext CallContext::WithDeadline(SteadyTime at) const {
  CallContext c = *this;
  if (!c.deadline || at < *c.deadline) c.deadline = at;
  return c;
}

}  // namespace spotvisor
