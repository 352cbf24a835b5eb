// What the HTTP object stores (Cloud Storage, S3) share: the file I/O of
// parts and ranges, the store-wide transfer slots, a pool of HTTP handles
// whose requests honour a CallContext, and the retry loop bounded by it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/buffer_pool.h"
#include "common/cancel.h"
#include "common/status.h"
#include "http/http_client.h"
#include "retry/backoff_policy.h"
#include "retry/retry_loop.h"
#include "retry/retry_policy.h"
#include "retry/sleeper.h"

namespace spotvisor {

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
};

// Reads up to `max` bytes at `offset` into `buf` (resized to what was read).
// `buf` is reused from chunk to chunk: growing it zero-fills only the first
// time, so a 16 MiB chunk is not memset again for every chunk.
Status ReadAt(int fd, std::uint64_t offset, std::size_t max, std::string& buf);
// kFailedPrecondition when `path` no longer names the file open as `fd`
// (the trainer renamed a new save over it, or deleted it): an upload stops
// at its next chunk and closes the file, so the blocks of a replaced save
// are freed now, not when the whole upload would have ended.
Status StillNamed(int fd, const std::string& path);

// Writes all of `data` at `offset`. A local write error (a full disk) is
// the user's to fix, not the network's: kFailedPrecondition, never retried.
Status WriteAt(int fd, std::uint64_t offset, std::string_view data, const std::string& path);

// Creates `path` and reserves `size` bytes for a download written in place
// (ranges in parallel). A full disk is kFailedPrecondition.
StatusOr<int> CreateForRanges(const std::string& path, std::uint64_t size);

// A download's bytes on their way to a file, from `offset` on: gathered
// into blocks and written with one pwrite each. libcurl hands a body over
// 16-256 KiB at a time, at any length; written as they come, every piece
// is a syscall, and on ext4 a piece that ends inside a block makes the
// kernel zero the rest of the block before the next piece overwrites it.
// With `file_mu`, the writers of one file (parallel ranges) take turns in
// user space: ext4 serialises buffered writes to a file on its inode lock
// anyway, and the lock's waiters spin on the CPU the writer needs (perf on
// a 4 GiB restore with 4 ranges: a third of its time), where a mutex's
// waiters sleep. Memory: one block per writer, taken from the transfer
// buffer pool on first use and given back with the writer.
class BlockWriter {
 public:
  static constexpr std::size_t kMaxBlock = 4 << 20;
  // `expected`: the bytes this writer will likely get (0: unknown); the
  // block is no bigger than that, from 64 KiB up to kMaxBlock.
  BlockWriter(int fd, std::uint64_t offset, const std::string& path, std::uint64_t expected,
              std::mutex* file_mu = nullptr);
  BlockWriter(const BlockWriter&) = delete;
  BlockWriter& operator=(const BlockWriter&) = delete;
  // Errors as WriteAt's: a full disk is kFailedPrecondition.
  Status Write(std::string_view data);
  // Writes what is gathered; call after the last Write.
  Status Flush();

 private:
  int fd_;
  std::uint64_t next_;  // file offset of the block's first byte
  const std::string& path_;
  std::mutex* file_mu_;
  std::size_t cap_;
  std::optional<PooledBuffer> buf_;  // from BufferPool::Transfers(): no fresh pages per file
  std::size_t fill_ = 0;
};

// One byte range of a download being written in place: bytes
// [first, first + length) of the file `fd`, its crc32c and length kept as
// the chunks arrive, each chunk reported to the context, the bytes written
// through a BlockWriter (under `file_mu`, shared by the file's ranges) and
// flushed when the last one arrives. Feed is an HttpRequest::on_body;
// after the request, `error` says why it stopped early (more bytes than
// asked for, a local write error).
struct RangeWriter {
  RangeWriter(int fd_, std::uint64_t first_, std::uint64_t length_, const std::string& path_, const std::string& what_,
              const CallContext& ctx_, std::uint64_t& counted_, std::mutex* file_mu = nullptr)
      : first(first_),
        length(length_),
        path(path_),
        what(what_),
        ctx(ctx_),
        counted(counted_),
        out(fd_, first_, path_, length_, file_mu) {}
  std::uint64_t first, length;
  const std::string& path;
  const std::string& what;  // "s3://b/o", for the message
  const CallContext& ctx;
  std::uint64_t& counted;  // bytes reported by this attempt, taken back on a retry
  std::uint32_t crc = 0;
  std::uint64_t got = 0;
  Status error;
  bool Feed(std::string_view chunk);

 private:
  BlockWriter out;
};

// A whole object downloaded into `fd` from offset 0: its crc32c and size
// as the chunks arrive, each reported to the context (and to `counted`,
// taken back on a retry), the bytes through a BlockWriter. Feed is an
// HttpRequest::on_body; Finish() after a complete response writes the
// last block. `error` says why Feed stopped the transfer.
struct FileWriter {
  FileWriter(int fd, const std::string& path, std::uint64_t size_hint, const CallContext& ctx_,
             std::uint64_t& counted_)
      : ctx(ctx_), counted(counted_), out(fd, 0, path, size_hint) {}
  const CallContext& ctx;
  std::uint64_t& counted;
  std::uint32_t crc = 0;
  std::uint64_t size = 0;
  Status error;
  bool Feed(std::string_view chunk);
  Status Finish() { return out.Flush(); }

 private:
  BlockWriter out;
};

// "bytes FIRST-LAST/TOTAL" -> TOTAL.
std::optional<std::uint64_t> ParseContentRangeTotal(const std::string& h);

// At most `normal` transfers (whole uploads and downloads, parts and ranges)
// at once in the whole store; an urgent context (the final sync inside a
// Spot window) may run up to `urgent`. Waiting for a slot honours the
// context's deadline and cancellation.
class TransferSlots {
 public:
  TransferSlots(int normal, int urgent);
  int Capacity(const CallContext& ctx) const { return ctx.urgent ? urgent_ : normal_; }
  Status Acquire(const CallContext& ctx);
  void Release();

 private:
  const int normal_, urgent_;
  std::mutex mu_;
  std::condition_variable cv_;
  int in_use_ = 0;
};

class Slot {
 public:
  Slot(TransferSlots& slots, const CallContext& ctx) : slots_(slots), status_(slots.Acquire(ctx)) {}
  ~Slot() {
    if (status_.ok()) slots_.Release();
  }
  Slot(const Slot&) = delete;
  Slot& operator=(const Slot&) = delete;
  const Status& status() const { return status_; }

 private:
  TransferSlots& slots_;
  Status status_;
};

// One HTTP handle per concurrent request, reused so connections are kept
// alive. Send clamps the request's timeout to what the context has left and
// cuts it short at once if the context is cancelled meanwhile.
class HttpPool {
 public:
  explicit HttpPool(std::function<std::unique_ptr<HttpClient>()> make) : make_(std::move(make)) {}
  StatusOr<HttpResponse> Send(HttpRequest& req, const CallContext& ctx);

 private:
  std::function<std::unique_ptr<HttpClient>()> make_;
  std::mutex mu_;
  std::vector<std::shared_ptr<HttpClient>> pool_;
};

// Backoff waits: the injected sleeper (tests) for the delay, cut short by
// the context's cancellation and never running past its deadline.
class ContextSleeper final : public Sleeper {
 public:
  ContextSleeper(const CallContext& ctx, Sleeper* inner) : ctx_(ctx), inner_(inner) {}
  bool SleepFor(std::chrono::milliseconds d) override;

 private:
  const CallContext& ctx_;
  Sleeper* inner_;
};

// Google's and AWS's retry strategy, bounded by the context: every wait ends
// at the deadline or on cancellation, and an urgent context (the final sync
// in a Spot window) retries quickly until its deadline instead of backing
// off to 32 s.
struct StoreRetry {
  std::function<std::unique_ptr<RetryPolicy>()> make_retry;
  std::function<std::unique_ptr<BackoffPolicy>()> make_backoff;
  Sleeper* sleeper = nullptr;

  // Fills in Google's defaults (6 errors, 1 s .. 32 s) where unset.
  void Defaults(Sleeper* fallback);

  template <typename Fn>
  auto Run(const CallContext& ctx, Idempotency idempotency, Fn&& fn) const -> decltype(fn()) {
    using Result = decltype(fn());
    if (auto s = ctx.Check("request"); !s.ok()) return Result(s);
    std::unique_ptr<RetryPolicy> retry;
    std::unique_ptr<BackoffPolicy> backoff;
    if (ctx.urgent && ctx.deadline) {
      retry = std::make_unique<RetryForeverPolicy>();
      backoff = std::make_unique<ExponentialBackoffPolicy>(std::chrono::milliseconds(100), std::chrono::seconds(1), 2.0);
    } else {
      retry = make_retry();
      backoff = make_backoff();
    }
    ContextSleeper s(ctx, sleeper);
    auto result = RetryLoop(*retry, *backoff, idempotency, s, [&]() -> Result {
      if (auto c = ctx.Check("request"); !c.ok()) return Result(c);
      return fn();
    });
    // A wait cut short by the deadline reads better as what it is.
    Status st = internal::StatusOf(result);
    if (st.code() == StatusCode::kCancelled && !ctx.cancelled() && ctx.deadline) {
      return Result(DeadlineExceededError("out of time after: " + st.message()));
    }
    return result;
  }
};

}  // namespace spotvisor
