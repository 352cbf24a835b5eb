// Buffers for the chunks and parts of transfers, kept between uses.
//
// An upload reads each chunk (16 MiB to Cloud Storage, 8 MiB parts to S3)
// into a buffer. A fresh buffer per chunk costs a page fault per 4 KiB and
// a zero fill before the read overwrites it: on S3 that was a fifth of
// spotvisor's CPU per GiB (issue #31). Buffers taken from here keep their
// capacity: one per transfer thread is enough for a whole sync. When the
// sync is over, ReleaseFreeMemory (common/memory.h) empties the pool, so
// the idle daemon holds none of it.
#pragma once

#include <cstddef>
#include <mutex>
#include <string>
#include <vector>

namespace spotvisor {

class BufferPool {
 public:
  // The pool transfers use; thread-safe.
  static BufferPool& Transfers();

  // An empty string, with the capacity of a buffer given back before when
  // there is one.
  std::string Take();
  // Kept for the next Take (up to kMaxKept; the rest are freed).
  void Give(std::string buffer);
  // Frees every kept buffer; returns the bytes freed.
  std::size_t Clear();
  std::size_t kept() const;

  static constexpr std::size_t kMaxKept = 64;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> free_;
};

// A buffer from a pool for one scope: given back when it ends.
class PooledBuffer {
 public:
  explicit PooledBuffer(BufferPool& pool = BufferPool::Transfers()) : pool_(pool), buf_(pool.Take()) {}
  ~PooledBuffer() { pool_.Give(std::move(buf_)); }
  PooledBuffer(const PooledBuffer&) = delete;
  PooledBuffer& operator=(const PooledBuffer&) = delete;
  std::string& operator*() { return buf_; }
  std::string* operator->() { return &buf_; }

 private:
  BufferPool& pool_;
  std::string buf_;
};

}  // namespace spotvisor
