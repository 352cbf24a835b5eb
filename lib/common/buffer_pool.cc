#include "common/buffer_pool.h"

namespace spotvisor {

BufferPool& BufferPool::Transfers() {
  static BufferPool* pool = new BufferPool();  // never destroyed: threads may give back at exit
  return *pool;
}

std::string BufferPool::Take() {
  std::lock_guard lk(mu_);
  if (free_.empty()) return {};
  // The largest, so a chunk never grows a small buffer while a big one waits.
  std::size_t best = 0;
  for (std::size_t i = 1; i < free_.size(); ++i) {
    if (free_[i].capacity() > free_[best].capacity()) best = i;
  }
  std::string out = std::move(free_[best]);
  free_[best] = std::move(free_.back());
  free_.pop_back();
  out.clear();
  return out;
}

void BufferPool::Give(std::string buffer) {
  if (buffer.capacity() < 4096) return;  // nothing worth keeping
  std::lock_guard lk(mu_);
  if (free_.size() < kMaxKept) free_.push_back(std::move(buffer));
}

std::size_t BufferPool::Clear() {
  std::vector<std::string> gone;
  {
    std::lock_guard lk(mu_);
    gone.swap(free_);
  }
  std::size_t bytes = 0;
  for (auto const& b : gone) bytes += b.capacity();
  return bytes;
}

std::size_t BufferPool::kept() const {
  std::lock_guard lk(mu_);
  return free_.size();
}

}  // namespace spotvisor
