#include "storage/transfer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/strings.h"
#include "storage/crc32c.h"

namespace spotvisor {

Fd::~Fd() {
  if (fd >= 0) close(fd);
}

Status ReadAt(int fd, std::uint64_t offset, std::size_t max, std::string& buf) {
  if (buf.size() < max) buf.resize(max);
  std::size_t got = 0;
  while (got < max) {
    ssize_t n = pread(fd, buf.data() + got, max - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoToStatus(errno, "reading");
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  buf.resize(got);
  return OkStatus();
}

Status StillNamed(int fd, const std::string& path) {
  struct stat open_st {}, named {};
  if (fstat(fd, &open_st) != 0) return ErrnoToStatus(errno, "checking " + path);
  if (stat(path.c_str(), &named) != 0 || named.st_dev != open_st.st_dev || named.st_ino != open_st.st_ino) {
    return FailedPreconditionError(path + " was replaced while being uploaded");
  }
  return OkStatus();
}

Status WriteAt(int fd, std::uint64_t offset, std::string_view data, const std::string& path) {
  while (!data.empty()) {
    ssize_t n = pwrite(fd, data.data(), data.size(), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      auto e = ErrnoToStatus(errno, "writing " + path);
      return e.code() == StatusCode::kInternal ? FailedPreconditionError(e.message()) : e;
    }
    data.remove_prefix(static_cast<std::size_t>(n));
    offset += static_cast<std::uint64_t>(n);
  }
  return OkStatus();
}

StatusOr<int> CreateForRanges(const std::string& path, std::uint64_t size) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "creating " + path);
  if (int e = posix_fallocate(fd, 0, static_cast<off_t>(size)); e != 0 && e != EOPNOTSUPP && e != EINVAL) {
    close(fd);
    auto st = ErrnoToStatus(e, "allocating " + std::to_string(size) + " bytes for " + path);
    return st.code() == StatusCode::kInternal ? FailedPreconditionError(st.message()) : st;
  }
  return fd;
}

BlockWriter::BlockWriter(int fd, std::uint64_t offset, const std::string& path, std::uint64_t expected,
                         std::mutex* file_mu)
    : fd_(fd),
      next_(offset),
      path_(path),
      file_mu_(file_mu),
      cap_(expected == 0 ? std::size_t{1} << 20
                         : static_cast<std::size_t>(std::clamp<std::uint64_t>(expected, 64 << 10, kMaxBlock))) {}

Status BlockWriter::Write(std::string_view data) {
  while (!data.empty()) {
    if (!buf_) {
      buf_.emplace();
      // A pooled buffer was mapped before: its zero fill touches no new pages.
      if ((*buf_)->size() < cap_) (*buf_)->resize(cap_);
    }
    std::size_t n = std::min(cap_ - fill_, data.size());
    std::memcpy((*buf_)->data() + fill_, data.data(), n);
    fill_ += n;
    data.remove_prefix(n);
    if (fill_ == cap_) {
      if (auto s = Flush(); !s.ok()) return s;
    }
  }
  return OkStatus();
}

Status BlockWriter::Flush() {
  if (fill_ == 0) return OkStatus();
  std::unique_lock<std::mutex> lk;
  if (file_mu_) lk = std::unique_lock<std::mutex>(*file_mu_);
  auto s = WriteAt(fd_, next_, std::string_view((*buf_)->data(), fill_), path_);
  // Start writing the block to disk now (asynchronously), so the disk works
  // while the rest comes in and the fsync at the end waits only for the
  // last blocks. Left to the kernel, writeback starts only past
  // dirty_background_ratio (10% of memory) and the fsync after a 10 GiB
  // restore could wait for gigabytes. A filesystem that cannot (EINVAL,
  // ESPIPE) just leaves it to that fsync.
  if (s.ok()) (void)sync_file_range(fd_, static_cast<off_t>(next_), static_cast<off_t>(fill_), SYNC_FILE_RANGE_WRITE);
  next_ += fill_;
  fill_ = 0;
  return s;
}

bool RangeWriter::Feed(std::string_view chunk) {
  if (got + chunk.size() > length) {
    error = UnavailableError("downloading " + what + ": more bytes than the range asked for");
    return false;
  }
  crc = Crc32cExtend(crc, chunk);
  error = out.Write(chunk);
  got += chunk.size();
  counted += chunk.size();
  ctx.Moved(static_cast<std::int64_t>(chunk.size()));
  if (error.ok() && got == length) error = out.Flush();
  return error.ok();
}

bool FileWriter::Feed(std::string_view chunk) {
  crc = Crc32cExtend(crc, chunk);
  error = out.Write(chunk);
  size += chunk.size();
  counted += chunk.size();
  ctx.Moved(static_cast<std::int64_t>(chunk.size()));
  return error.ok();
}

std::optional<std::uint64_t> ParseContentRangeTotal(const std::string& h) {
  auto slash = h.rfind('/');
  if (slash == std::string::npos || h.rfind("bytes ", 0) != 0) return std::nullopt;
  return ParseUint64(Trim(std::string_view(h).substr(slash + 1)));
}

TransferSlots::TransferSlots(int normal, int urgent) : normal_(std::max(1, normal)), urgent_(std::max(normal_, urgent)) {}

Status TransferSlots::Acquire(const CallContext& ctx) {
  std::uint64_t sub = 0;
  if (ctx.cancel) {
    sub = ctx.cancel->Subscribe([this] {
      std::lock_guard lk(mu_);
      cv_.notify_all();
    });
  }
  Status result;
  {
    std::unique_lock lk(mu_);
    int cap = Capacity(ctx);
    while (in_use_ >= cap) {
      if (auto c = ctx.Check("waiting for a transfer slot"); !c.ok()) {
        result = c;
        break;
      }
      cv_.wait_for(lk, ctx.deadline ? std::max(ctx.Remaining(std::chrono::seconds(1)), std::chrono::milliseconds(1))
                                    : std::chrono::milliseconds(1000));
    }
    if (result.ok()) ++in_use_;
  }
  if (ctx.cancel) ctx.cancel->Unsubscribe(sub);
  return result;
}

void TransferSlots::Release() {
  {
    std::lock_guard lk(mu_);
    --in_use_;
  }
  cv_.notify_all();
}

StatusOr<HttpResponse> HttpPool::Send(HttpRequest& req, const CallContext& ctx) {
  if (auto s = ctx.Check(req.method + " " + req.url); !s.ok()) return s;
  if (ctx.deadline) {
    auto left = ctx.Remaining(req.timeout);
    if (left.count() <= 0) return DeadlineExceededError(req.url + ": out of time");
    req.timeout = left;
    req.connect_timeout = std::min(req.connect_timeout, left);
  }
  std::shared_ptr<HttpClient> shared;
  {
    std::lock_guard lk(mu_);
    if (!pool_.empty()) {
      shared = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  if (!shared) shared = make_();
  std::uint64_t sub = 0;
  if (ctx.cancel) sub = ctx.cancel->Subscribe([shared] { shared->Cancel(); });
  auto r = shared->Perform(req);
  if (ctx.cancel) ctx.cancel->Unsubscribe(sub);
  // A cancelled handle stays cancelled: it is not given back to the pool.
  if (!ctx.cancelled()) {
    std::lock_guard lk(mu_);
    pool_.push_back(std::move(shared));
  }
  return r;
}

bool ContextSleeper::SleepFor(std::chrono::milliseconds d) {
  if (ctx_.cancelled()) return false;
  if (ctx_.deadline && ctx_.Remaining(d) < d) return false;  // the next attempt would start too late
  if (inner_) return inner_->SleepFor(d) && !ctx_.cancelled();
  return ctx_.SleepFor(d);
}

void StoreRetry::Defaults(Sleeper* fallback) {
  if (!make_retry) make_retry = [] { return std::make_unique<LimitedErrorCountRetryPolicy>(6); };
  if (!make_backoff) {
    make_backoff = [] { return std::make_unique<ExponentialBackoffPolicy>(std::chrono::seconds(1), std::chrono::seconds(32), 2.0); };
  }
  if (!sleeper) sleeper = fallback;
}

}  // namespace spotvisor
