#include "sync/sync_engine.h"
#include "sync/completeness.h"
#include "sync/file_facts.h"
#include "sync/manifest.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/parallel_for.h"
#include "common/random.h"
#include "common/strings.h"
#include "log/logger.h"
#include "output/utf8.h"
#include "storage/crc32c.h"

namespace spotvisor {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr const char* kManifest = kManifestObject;
constexpr const char* kDone = kDoneObject;

// GCS allows 1024 bytes for a whole object name; this leaves room for the
// bucket prefix, the run-id, "checkpoints/" and "~SEQ.NONCE".
constexpr std::size_t kMaxRelPath = 900;
constexpr int kMaxDepth = 64;
// File times advance in ticks of at most 10 ms; within one tick below the
// marker, a file may have been written before it or after it.
constexpr std::int64_t kTickNs = 10'000'000;

std::string Escaped(const std::string& s) { return output::EscapeInvalidUtf8(s); }

// JSON text of `j`; text from outside is escaped, never thrown on.
std::string Dump(const Json& j, int indent = -1) { return j.dump(indent, ' ', false, Json::error_handler_t::replace); }

std::string RandomHex(int bytes) {
  std::string out;
  while (static_cast<int>(out.size()) < bytes * 2) out += fmt::format("{:016x}", RandomSeed());
  return out.substr(0, static_cast<std::size_t>(bytes) * 2);
}

std::int64_t Ns(const timespec& t) { return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; }

// What identifies one version of a file: any write, truncate, rename over it
// or metadata change moves ctime, which a trainer cannot set back.
struct FileStat {
  std::uint64_t size = 0;
  std::int64_t mtime_ns = 0;
  std::int64_t ctime_ns = 0;
  ino_t ino = 0;
  dev_t dev = 0;
  bool operator==(const FileStat& o) const {
    return size == o.size && mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns && ino == o.ino && dev == o.dev;
  }
  bool operator!=(const FileStat& o) const { return !(*this == o); }
};

FileStat StatOf(const struct stat& st) {
  return FileStat{static_cast<std::uint64_t>(st.st_size), Ns(st.st_mtim), Ns(st.st_ctim), st.st_ino, st.st_dev};
}

std::optional<FileStat> LstatRegular(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return StatOf(st);
}

double Since(SteadyTime start, const Clock& clock) { return std::chrono::duration<double>(clock.Now() - start).count(); }

using completeness::IsInProgressDir;
using completeness::IsInProgressFile;

struct ScanEntry {
  std::string rel;
  FileStat st;
};

struct Scan {
  std::vector<ScanEntry> files;  // in the order found
  std::vector<std::string> unstorable;
  std::optional<FileStat> marker;
  std::int64_t newest_ns = 0;
};

// Walks the tree in two passes. The first reads every directory (entry
// types come from readdir, so nothing is stat'ed yet) and lists the regular
// files; the second lstat's them, on several threads when there are many:
// a no-op sync of 10,000 files spent most of its time in the kernel's path
// lookup for fstatat, one file after another (issue #15). Symlinks are not
// followed; entries that vanish while we look are not part of this snapshot.
struct Candidate {
  std::size_t dir;  // index into ScanState::dir_fds
  std::string name;
  std::string rel;
  bool marker = false;
  std::optional<FileStat> st;  // filled by the second pass
};

struct ScanState {
  std::vector<int> dir_fds;  // kept open for the second pass
  std::vector<Candidate> candidates;
  ~ScanState() {
    for (int fd : dir_fds) close(fd);
  }
};

// More open directories than this and the rest are stat'ed in the first pass.
constexpr std::size_t kMaxKeptDirs = 256;
// Below this many files one thread is faster than starting others.
constexpr std::size_t kParallelStatMin = 2048;
constexpr std::size_t kStatChunk = 512;

Status Walk(const std::string& root, const std::string& rel_dir, int depth, ScanState& st, Scan& out) {
  std::string dir = rel_dir.empty() ? root : root + "/" + rel_dir;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (!rel_dir.empty() && (errno == ENOENT || errno == ENOTDIR)) return OkStatus();
    return ErrnoToStatus(errno, "reading " + Escaped(dir));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(d, closedir);
  // The directory's own fd, kept for the second pass (or -1: stat now).
  int kept = -1;
  if (st.dir_fds.size() < kMaxKeptDirs) {
    kept = fcntl(dirfd(d), F_DUPFD_CLOEXEC, 0);
    if (kept >= 0) st.dir_fds.push_back(kept);
  }
  std::vector<std::string> subdirs;
  for (;;) {
    errno = 0;
    dirent* e = readdir(d);
    if (e == nullptr) {
      if (errno != 0) return ErrnoToStatus(errno, "reading " + Escaped(dir));
      break;
    }
    const char* cname = e->d_name;
    if (cname[0] == '.' && (cname[1] == 0 || (cname[1] == '.' && cname[2] == 0))) continue;
    std::string name = cname;
    unsigned char type = e->d_type;
    struct stat sb {};
    bool have_stat = false;
    if (type == DT_UNKNOWN || (type == DT_REG && kept < 0)) {
      // Some file systems do not say; and past kMaxKeptDirs there is no fd
      // to come back with.
      if (fstatat(dirfd(d), cname, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;
        return ErrnoToStatus(errno, "reading " + Escaped(dir + "/" + name));
      }
      have_stat = true;
      type = S_ISDIR(sb.st_mode) ? DT_DIR : S_ISREG(sb.st_mode) ? DT_REG : DT_LNK;
    }
    if (type == DT_DIR) {
      if (depth == 0 && (name == kStagingDir || name == kSetAsideDir)) continue;
      if (IsInProgressDir(name) || depth + 1 >= kMaxDepth) continue;
      subdirs.push_back(std::move(name));
      continue;
    }
    if (type != DT_REG) continue;  // symlinks, sockets, fifos are not checkpoints
    std::string rel = rel_dir.empty() ? name : rel_dir + "/" + name;
    Candidate c;
    if (depth == 0 && name == kCompleteMarker) {
      c.marker = true;
    } else if (name.find(kRestoreTmp) != std::string::npos || IsInProgressFile(name)) {
      continue;
    } else if (!UnstorableReason(rel).empty()) {
      out.unstorable.push_back(std::move(rel));
      continue;
    }
    if (have_stat) c.st = StatOf(sb);
    c.dir = kept >= 0 ? st.dir_fds.size() - 1 : 0;
    if (kept >= 0 && !have_stat) c.name = std::move(name);
    c.rel = std::move(rel);
    st.candidates.push_back(std::move(c));
  }
  guard.reset();
  for (auto& sub : subdirs) {
    std::string rel = rel_dir.empty() ? sub : rel_dir + "/" + sub;
    if (auto s = Walk(root, rel, depth + 1, st, out); !s.ok()) return s;
  }
  return OkStatus();
}

StatusOr<Scan> ScanTree(const std::string& root) {
  Scan scan;
  struct stat rst {};
  if (stat(root.c_str(), &rst) != 0) {
    if (errno == ENOENT) return scan;  // nothing written yet
    return ErrnoToStatus(errno, "reading " + Escaped(root));
  }
  ScanState st;
  if (auto s = Walk(root, "", 0, st, scan); !s.ok()) return s;
  // The second pass: lstat what the first pass only named.
  auto& cs = st.candidates;
  auto stat_range = [&](std::size_t from, std::size_t to) -> Status {
    for (std::size_t i = from; i < to; ++i) {
      auto& c = cs[i];
      if (c.st || c.name.empty()) continue;
      struct stat sb {};
      if (fstatat(st.dir_fds[c.dir], c.name.c_str(), &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;  // gone since the directory was read
        return ErrnoToStatus(errno, "reading " + Escaped(root + "/" + c.rel));
      }
      if (S_ISREG(sb.st_mode)) c.st = StatOf(sb);  // else replaced by something that is not a file
    }
    return OkStatus();
  };
  unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  int threads = cs.size() < kParallelStatMin ? 1 : static_cast<int>(std::min(4u, cores));
  std::size_t chunks = (cs.size() + kStatChunk - 1) / kStatChunk;
  auto s = threads == 1 ? stat_range(0, cs.size()) : ParallelFor(chunks, threads, [&](std::size_t k) {
    return stat_range(k * kStatChunk, std::min(cs.size(), (k + 1) * kStatChunk));
  });
  if (!s.ok()) return s;
  scan.files.reserve(cs.size());
  for (auto& c : cs) {
    if (!c.st) continue;
    if (c.marker) {
      scan.marker = c.st;
      continue;
    }
    scan.newest_ns = std::max(scan.newest_ns, c.st->mtime_ns);
    scan.files.push_back(ScanEntry{std::move(c.rel), *c.st});
  }
  std::sort(scan.files.begin(), scan.files.end(), [](auto const& a, auto const& b) { return a.rel < b.rel; });
  return scan;
}

// Every file of the snapshot is still exactly as it was scanned.
bool Unchanged(const std::string& root, const Scan& scan) {
  for (auto const& e : scan.files) {
    auto now = LstatRegular(root + "/" + e.rel);
    if (!now || *now != e.st) return false;
  }
  return true;
}

// Counts the bytes a transfer's store calls confirm (CallContext::on_bytes)
// and hands a SyncProgress to the handler at most every `every`, from
// whichever worker crossed the mark.
class ProgressMeter {
 public:
  ProgressMeter(std::string op, std::uint64_t total, int files, const Clock& clock, std::chrono::milliseconds every,
                const std::function<void(const SyncProgress&)>& report)
      : op_(std::move(op)), total_(total), files_(files), clock_(clock), every_(every), report_(report),
        start_(clock.Now()), next_(start_ + every) {}
  // The caller's context, counting into this meter.
  CallContext Counting(const CallContext& ctx) {
    CallContext c = ctx;
    if (report_ && every_.count() > 0) c.on_bytes = [this](std::int64_t n) { Add(n); };
    return c;
  }

 private:
  void Add(std::int64_t n) {
    auto done = done_.fetch_add(n) + n;
    auto now = clock_.Now();
    std::unique_lock lk(mu_, std::try_to_lock);
    if (!lk.owns_lock() || now < next_) return;
    next_ = now + every_;
    SyncProgress p;
    p.op = op_;
    p.bytes_done = static_cast<std::uint64_t>(std::clamp<std::int64_t>(done, 0, static_cast<std::int64_t>(total_)));
    p.bytes_total = total_;
    p.files_total = files_;
    p.elapsed_s = std::chrono::duration<double>(now - start_).count();
    report_(p);
  }

  const std::string op_;
  const std::uint64_t total_;
  const int files_;
  const Clock& clock_;
  const std::chrono::milliseconds every_;
  const std::function<void(const SyncProgress&)>& report_;
  const SteadyTime start_;
  std::atomic<std::int64_t> done_{0};
  std::mutex mu_;
  SteadyTime next_;
};

StatusOr<std::uint32_t> FileCrc32c(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, Escaped(path));
  char buf[1 << 16];
  std::uint32_t crc = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return ErrnoToStatus(err, Escaped(path));
    }
    if (n == 0) break;
    crc = Crc32cExtend(crc, std::string_view(buf, static_cast<std::size_t>(n)));
  }
  close(fd);
  return crc;
}

// Copies src to dst (created), in the kernel where it can.
Status CopyFile(const std::string& src, const std::string& dst) {
  int in = open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return ErrnoToStatus(errno, Escaped(src));
  int out = open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) {
    int err = errno;
    close(in);
    return ErrnoToStatus(err, "creating " + Escaped(dst));
  }
  Status s;
  bool fallback = false;
  for (;;) {
    ssize_t n = copy_file_range(in, nullptr, out, nullptr, 1 << 30, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
      fallback = true;
      break;
    }
    if (n < 0) {
      s = ErrnoToStatus(errno, "copying " + Escaped(src));
      break;
    }
    if (n == 0) break;
  }
  if (fallback) {
    char buf[1 << 16];
    for (;;) {
      ssize_t n = read(in, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        s = ErrnoToStatus(errno, "reading " + Escaped(src));
        break;
      }
      if (n == 0) break;
      for (ssize_t done = 0; done < n;) {
        ssize_t w = write(out, buf + done, static_cast<std::size_t>(n - done));
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) {
          s = ErrnoToStatus(errno, "writing " + Escaped(dst));
          break;
        }
        done += w;
      }
      if (!s.ok()) break;
    }
  }
  close(in);
  close(out);
  return s;
}

// Creates dir/a/b/... for `rel`'s parent, refusing to pass through a symlink
// (a restored checkpoint must never be written outside the checkpoint dir).
// New directories are given to the trainer's user.
Status MakeParentsNoSymlinks(const std::string& dir, const std::string& rel, const SyncOptions& o) {
  std::string cur = dir;
  auto parts = fs::path(rel).parent_path();
  for (auto const& part : parts) {
    cur += '/';
    cur += part.string();
    struct stat st {};
    if (lstat(cur.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode)) return PermissionDeniedError(fmt::format("refusing to restore through symlink {}", Escaped(cur)));
      if (!S_ISDIR(st.st_mode)) return FailedPreconditionError(fmt::format("{} is not a directory", Escaped(cur)));
      continue;
    }
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "creating " + Escaped(cur));
    if (o.owner_uid && lchown(cur.c_str(), *o.owner_uid, o.owner_gid.value_or(static_cast<gid_t>(-1))) != 0) {
      return ErrnoToStatus(errno, "giving " + Escaped(cur) + " to the trainer's user");
    }
  }
  return OkStatus();
}

Status GiveToOwner(const std::string& path, const SyncOptions& o, mode_t mode) {
  if (o.owner_uid && lchown(path.c_str(), *o.owner_uid, o.owner_gid.value_or(static_cast<gid_t>(-1))) != 0) {
    return ErrnoToStatus(errno, "giving " + Escaped(path) + " to the trainer's user");
  }
  if (chmod(path.c_str(), mode) != 0) return ErrnoToStatus(errno, "setting the mode of " + Escaped(path));
  return OkStatus();
}

// Writes `text` to `path` so that a crash leaves the old or the new file.
// `mode`: 0600 for spotvisor's own record, 0644 for what the trainer reads.
Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode = 0600) {
  auto tmp = path + ".tmp";
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return ErrnoToStatus(errno, "creating " + tmp);
  fchmod(fd, mode);  // whatever the umask, and a leftover .tmp's old mode
  for (std::size_t done = 0; done < text.size();) {
    ssize_t w = write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoToStatus(err, "writing " + tmp);
    }
    done += static_cast<std::size_t>(w);
  }
  if (fsync(fd) != 0) {
    int err = errno;
    close(fd);
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "flushing " + tmp);
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoToStatus(err, "renaming " + tmp);
  }
  auto parent = fs::path(path).parent_path().string();
  int dfd = open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return OkStatus();
}

// Moves `move` (paths relative to ROOT: local files that differ from the
// commit being restored) into a folder of its own,
// ROOT/.spotvisor-unverified/TIME-PID/ (`*dir`), keeping whatever earlier
// restores set aside, and removes directories the move left empty (a
// half-written checkpoint-N/ must not stay for the trainer to resume from).
// Returns how many files were moved.
StatusOr<int> SetAside(const std::string& root, const std::vector<std::string>& move, const SyncOptions& o,
                       WallTime now, std::string* dir, const char* folder = kSetAsideDir) {
  if (move.empty()) return 0;
  auto top = root + "/" + folder;
  struct stat st {};
  if (lstat(top.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(fmt::format("{} is not a directory: move it away to let a restore set files aside",
                                               Escaped(top)));
  }
  if (mkdir(top.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "creating " + Escaped(top));
  if (auto g = GiveToOwner(top, o, 0755); !g.ok()) return g;
  auto secs = std::chrono::duration_cast<std::chrono::seconds>(now.time_since_epoch()).count();
  time_t t = static_cast<time_t>(secs);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char stamp[32];
  strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%SZ", &tm);
  std::string aside;
  for (int n = 1;; ++n) {
    aside = fmt::format("{}/{}-{}{}", top, stamp, getpid(), n == 1 ? std::string() : fmt::format("-{}", n));
    if (mkdir(aside.c_str(), 0755) == 0) break;
    if (errno != EEXIST || n > 1000) return ErrnoToStatus(errno, "creating " + Escaped(aside));
  }
  if (auto g = GiveToOwner(aside, o, 0755); !g.ok()) return g;
  *dir = aside;
  int moved = 0;
  for (auto const& rel : move) {
    if (auto p = MakeParentsNoSymlinks(aside, rel, o); !p.ok()) return p;
    if (rename((root + "/" + rel).c_str(), (aside + "/" + rel).c_str()) != 0) {
      if (errno == ENOENT) continue;
      return ErrnoToStatus(errno, "moving " + Escaped(root + "/" + rel) + " aside");
    }
    ++moved;
    // Directories this emptied, innermost first; rmdir stops at one that
    // still holds something.
    for (auto d = fs::path(rel).parent_path(); !d.empty(); d = d.parent_path()) {
      if (rmdir((root + "/" + d.string()).c_str()) != 0) break;
    }
  }
  return moved;
}

// Removes the temporary files of restores that were killed mid-way
// (FILE.spotvisor-restore.PID, preallocated to the file's full size): left
// there, they hold the room the next restore needs. Not in what was set aside.
void RemoveStaleRestoreTemps(const std::string& root, int& count, std::uint64_t& bytes) {
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    auto name = it->path().filename().string();
    if (it.depth() == 0 && name == kSetAsideDir) {
      it.disable_recursion_pending();
      continue;
    }
    if (name.find(kRestoreTmp) == std::string::npos) continue;
    struct stat st {};
    if (lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (unlink(it->path().c_str()) == 0) {
      ++count;
      bytes += static_cast<std::uint64_t>(st.st_blocks) * 512;
    }
  }
}

bool IsNoSpace(const Status& s) { return s.message().find(std::strerror(ENOSPC)) != std::string::npos; }

// `spotvisor pull`'s own names in the directory it pulls into.
constexpr const char* kPullRecord = ".spotvisor-pull.json";
constexpr const char* kPullSetAsideDir = ".spotvisor-replaced";

std::optional<std::string> ReadSmallFile(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return std::nullopt;
  std::string data;
  char buf[1 << 16];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0 && data.size() < (64u << 20);) data.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return data;
}

// Every entry under `root` that is not a directory (files, symlinks, ...),
// relative, with its lstat; not inside what pulls and restores set aside.
StatusOr<std::vector<std::pair<std::string, struct stat>>> WalkAll(const std::string& root) {
  std::vector<std::pair<std::string, struct stat>> out;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::none, ec), end;
  if (ec) return ErrnoToStatus(ec.value(), "reading " + Escaped(root));
  for (; it != end; it.increment(ec)) {
    if (ec) return ErrnoToStatus(ec.value(), "reading " + Escaped(root));
    auto name = it->path().filename().string();
    if (it.depth() == 0 && (name == kPullSetAsideDir || name == kSetAsideDir)) {
      it.disable_recursion_pending();
      continue;
    }
    struct stat st {};
    if (lstat(it->path().c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) continue;
    out.emplace_back(fs::relative(it->path(), root).string(), st);
  }
  return out;
}

// Bytes under `dir` (regular files, not following symlinks).
std::uint64_t TreeBytes(const std::string& dir) {
  std::uint64_t total = 0;
  std::error_code ec;
  fs::recursive_directory_iterator it(dir, fs::directory_options::skip_permission_denied, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    struct stat st {};
    if (lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) total += static_cast<std::uint64_t>(st.st_size);
  }
  return total;
}

// "checkpoints/a/b~12.9f3c..." -> 12; legacy "checkpoints/a/b~12" -> 12.
std::optional<std::int64_t> ObjectSequence(const std::string& name) {
  auto tilde = name.rfind('~');
  if (tilde == std::string::npos) return std::nullopt;
  auto rest = name.substr(tilde + 1);
  auto dot = rest.find('.');
  auto v = ParseUint64(rest.substr(0, dot));
  if (!v || *v > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
  return static_cast<std::int64_t>(*v);
}

std::string JoinNames(const std::vector<std::string>& names, std::size_t max = 10) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < max; ++i) out += (i ? ", " : "") + fmt::format("\"{}\"", Escaped(names[i]));
  if (names.size() > max) out += fmt::format(" and {} more", names.size() - max);
  return out;
}

}  // namespace

std::string UnstorableReason(const std::string& rel) {
  if (!output::IsValidUtf8(rel)) return "not valid UTF-8";
  if (rel.find_first_of("\r\n") != std::string::npos) return "contains a carriage return or line feed";
  if (rel.size() > kMaxRelPath) return fmt::format("longer than {} bytes", kMaxRelPath);
  return "";
}

Status MarkCheckpointComplete(const std::string& checkpoint_dir) {
  // Two ticks of the clock that stamps files, so the marker is newer than
  // every file written before this call by more than the one-tick window
  // in which the order cannot be told.
  timespec wait{0, 2 * kTickNs};
  while (nanosleep(&wait, &wait) != 0 && errno == EINTR) {
  }
  auto path = checkpoint_dir + "/" + kCompleteMarker;
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return ErrnoToStatus(errno, "touching " + Escaped(path));
  // Now, explicitly: the marker must be at least as new as the last file.
  int rc = futimens(fd, nullptr);
  int err = errno;
  close(fd);
  if (rc != 0) return ErrnoToStatus(err, "touching " + Escaped(path));
  return OkStatus();
}

SyncEngine::SyncEngine(std::unique_ptr<ObjectStore> store, SyncOptions options, const Clock& clock)
    : store_(std::move(store)), o_(std::move(options)), clock_(clock) {
  while (o_.checkpoint_dir.size() > 1 && o_.checkpoint_dir.back() == '/') o_.checkpoint_dir.pop_back();
}

std::string SyncEngine::Fenced() const {
  std::lock_guard lk(fence_mu_);
  return fenced_;
}

StatusOr<RestoreStats> SyncEngine::Restore(const CallContext& ctx) {
  std::lock_guard lk(mu_);
  auto start = clock_.Now();
  RestoreStats stats;
  if (auto s = store_->CheckAccess(ctx); !s.ok()) return s;
  auto done = store_->ReadBytes(kDone, nullptr, ctx);
  if (done.ok()) {
    stats.done = true;
    stats.done_marker = Json::parse(*done, nullptr, false);
    if (stats.done_marker.is_discarded()) stats.done_marker = Escaped(done->substr(0, 200));
    stats.garbage_deleted = CollectAfterDone(ctx);
    return stats;
  }
  if (done.status().code() != StatusCode::kNotFound) return done.status();
  RemoveStaleRestoreTemps(o_.checkpoint_dir, stats.stale_temps_removed, stats.stale_temp_bytes);

  // What this disk last committed or restored, if it is the same run, the
  // same store and this very directory (same path, not a new disk or a
  // re-created directory there). `pending`: a commit it was making when it
  // stopped, which may have landed.
  struct Record {
    Manifest last;
    std::int64_t generation = -1;
    std::optional<Manifest> pending;
    bool trainer_running = false;  // spotvisor stopped without seeing its trainer exit
  };
  std::optional<Record> record;
  if (!o_.state_file.empty()) {
    int fd = open(o_.state_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      std::string data;
      char buf[1 << 16];
      for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0 && data.size() < (64u << 20);) {
        data.append(buf, static_cast<std::size_t>(n));
      }
      close(fd);
      auto j = Json::parse(data, nullptr, false);
      auto r = ParseManifest(data, o_.state_file, o_.checkpoint_dir);
      struct stat dst {};
      bool same_dir = stat(o_.checkpoint_dir.c_str(), &dst) == 0 && j.is_object() &&
                      GetString(j, "checkpoint_dir") == o_.checkpoint_dir &&
                      GetInt(j, "dir_dev") == static_cast<std::int64_t>(dst.st_dev) &&
                      GetInt(j, "dir_ino") == static_cast<std::int64_t>(dst.st_ino);
      if (r.ok() && same_dir && GetString(j, "run_id") == o_.run_id && GetString(j, "store") == store_->Describe()) {
        Record rec{std::move(*r), GetInt(j, "generation").value_or(-1), std::nullopt, false};
        if (auto t = j.find("trainer_running"); t != j.end() && t->is_boolean()) rec.trainer_running = t->get<bool>();
        if (auto p = j.find("pending"); p != j.end() && p->is_object()) {
          auto pm = ParseManifest(Dump(*p), o_.state_file + " (pending)", o_.checkpoint_dir);
          if (pm.ok() && !pm->commit_id.empty()) rec.pending = std::move(*pm);
        }
        record = std::move(rec);
      } else if (!r.ok()) {
        stats.state_warning = "ignoring " + o_.state_file + ": " + r.status().message();
      }
    }
  }
  // Local files newer than `base` (what the disk is known to hold), and
  // whether a save was cut off (a file not strictly older than the marker).
  struct LocalState {
    int newer = 0, missing = 0;
    bool torn = false;
    bool any = false;
    bool marker = false;
    std::vector<std::string> changed;  // the `newer` files: new, or not as `base` holds them
  };
  auto local_vs = [&](const std::vector<ManifestEntry>& base) -> StatusOr<LocalState> {
    auto scan = ScanTree(o_.checkpoint_dir);
    if (!scan.ok()) return scan.status();
    std::map<std::string, const ManifestEntry*> had;
    for (auto const& e : base) had[e.path] = &e;
    LocalState ls;
    ls.any = !scan->files.empty();
    ls.marker = scan->marker.has_value();
    for (auto const& f : scan->files) {
      auto it = had.find(f.rel);
      bool changed = it == had.end() || it->second->size != f.st.size || it->second->mtime_ns != f.st.mtime_ns;
      if (changed && it != had.end() && it->second->size == f.st.size) {
        // Another time but the same size: a copy a restore put back (one
        // that was killed before it could remember it) is the commit's own
        // file, not newer work to keep or to set aside over an earlier save.
        auto crc = FileCrc32c(o_.checkpoint_dir + "/" + f.rel);
        changed = !crc.ok() || *crc != it->second->crc;
      }
      if (changed) {
        ++ls.newer;
        ls.changed.push_back(f.rel);
      }
      if (scan->marker && f.st.mtime_ns > scan->marker->mtime_ns - kTickNs) ls.torn = true;  // a tie may be the next save's O_TRUNC
      if (it != had.end()) had.erase(it);
    }
    ls.missing = static_cast<int>(had.size());
    return ls;
  };

  ObjectInfo manifest_info;
  auto text = store_->ReadBytes(kManifest, &manifest_info, ctx);
  if (!text.ok()) {
    if (text.status().code() != StatusCode::kNotFound) return text.status();
    restored_ = true;  // nothing in the bucket yet
    manifest_generation_ = 0;
    sequence_ = 0;
    commit_id_.clear();
    state_.clear();
    std::string published = Publish("", "");
    if (o_.bucket_wins) {
      // A gang whose bucket holds nothing (or, with gang-checkpoint = all,
      // no complete set): every member starts from scratch, so no rank
      // resumes from a save the others do not have.
      auto ls = local_vs({});
      if (!ls.ok()) return ls.status();
      if (ls->any) {
        auto moved = SetAside(o_.checkpoint_dir, ls->changed, o_, clock_.WallNow(), &stats.set_aside_dir);
        if (!moved.ok()) return moved.status();
        stats.set_aside = *moved;
        stats.bucket_won = fmt::format("the bucket has no checkpoint of this gang, and every member starts from the same "
                                       "state: the trainer starts from scratch; the {} local file(s) are kept in {}",
                                       *moved, Escaped(stats.set_aside_dir));
      }
    } else if (record && record->last.commit_id.empty() && record->last.sequence == 0) {
      // A restart before the first commit: what this disk holds is the only
      // copy of the run's work. Keep it and resume from it.
      auto ls = local_vs({});
      if (!ls.ok()) return ls.status();
      if (ls->any && !ls->torn) {
        stats.resumed = true;
        stats.kept_local = true;
        stats.local_changes = ls->newer;
      } else if (ls->any) {
        stats.bucket_won = "the local checkpoint was cut off mid-save (files not older than the marker), and the bucket has none: "
                           "the trainer starts from scratch";
      }
    }
    stats.state_warning = RememberCommit(false);
    if (stats.state_warning.empty()) stats.state_warning = published;
    stats.seconds = Since(start, clock_);
    return stats;
  }
  auto m = ParseManifest(*text, store_->Describe() + "/" + kManifest, o_.checkpoint_dir);
  if (!m.ok()) return m.status();

  // Is the bucket's commit one this disk knows?
  const Manifest* known = nullptr;
  if (record) {
    if (!m->commit_id.empty() && record->last.commit_id == m->commit_id) {
      known = &record->last;
    } else if (m->commit_id.empty() && record->last.commit_id.empty() && record->generation == manifest_info.generation) {
      known = &record->last;
    } else if (record->pending && record->pending->commit_id == m->commit_id) {
      known = &*record->pending;  // committed just before this disk's spotvisor died
    } else {
      stats.bucket_won = fmt::format("the bucket has commit #{} and this disk last saw #{}", m->sequence, record->last.sequence);
    }
  }

  auto adopt = [&](FileMap files) {
    state_ = std::move(files);
    restored_ = true;
    manifest_generation_ = manifest_info.generation;
    sequence_ = m->sequence;
    commit_id_ = m->commit_id;
    marker_committed_ = m->marker;
    stats.resumed = true;
    stats.files = static_cast<int>(m->files.size());
    stats.sequence = sequence_;
    if (auto w = Publish(m->committed_at, m->instance); !w.empty()) stats.state_warning = w;
  };

  if (known) {
    // This disk holds that commit, perhaps with newer files: keep them,
    // unless the trainer's marker says its last save was cut off.
    auto ls = local_vs(known->files);
    if (!ls.ok()) return ls.status();
    // Changed while the trainer ran and spotvisor died (kill -9, crash,
    // power cut): without the marker nothing says the trainer finished that
    // save (an in-place torch.save cut off half-way looks like any other
    // file), and keeping a torn file would roll the run back. The bucket's
    // commit is the newest state known to be whole.
    bool unverified = record->trainer_running && !ls->marker && ls->newer > 0;
    bool gang = o_.bucket_wins && ls->newer > 0;
    // Files only missing, nothing new: not newer work but lost files (a
    // cleaned disk); the bucket puts them back. Otherwise local wins.
    if (!ls->torn && !unverified && !gang && (ls->newer > 0 || ls->missing == 0)) {
      FileMap files;
      for (auto const& e : known->files) files[e.path] = Uploaded{e.size, e.mtime_ns, e.crc, e.object, e.generation};
      adopt(std::move(files));
      stats.kept_local = ls->newer + ls->missing > 0;
      stats.local_changes = ls->newer + ls->missing;
      if (auto w = RememberCommit(m->marker); !w.empty()) stats.state_warning = w;
      stats.seconds = Since(start, clock_);
      return stats;
    }
    if (ls->torn) {
      stats.bucket_won = fmt::format("the local checkpoint was cut off mid-save (files not older than {}): restoring "
                                     "commit #{} from the bucket",
                                     kCompleteMarker, m->sequence);
    } else if (gang) {
      stats.bucket_won = fmt::format("{} file(s) changed here since commit #{}, but every member of a gang starts from the "
                                     "bucket's commit (rank 0's): restoring commit #{}",
                                     ls->newer, m->sequence, m->sequence);
    } else if (unverified) {
      stats.bucket_won = fmt::format(
          "{} file(s) changed since commit #{} while the trainer was running when spotvisor stopped (killed, crashed or "
          "powered off), and no {} says that save was complete: restoring commit #{} from the bucket. Have the trainer "
          "run `spotvisor checkpoint --done` after each save so a complete one is kept",
          ls->newer, m->sequence, kCompleteMarker, m->sequence);
    } else {
      stats.bucket_won = fmt::format("{} file(s) of commit #{} are missing here and nothing is newer: restoring them from "
                                     "the bucket",
                                     ls->missing, m->sequence);
    }
    if (ls->torn || unverified || gang) {
      auto moved = SetAside(o_.checkpoint_dir, ls->changed, o_, clock_.WallNow(), &stats.set_aside_dir);
      if (!moved.ok()) return moved.status();
      stats.set_aside = *moved;
      if (*moved > 0) {
        stats.bucket_won += fmt::format("; the {} local file(s) that differ from it are kept in {}", *moved,
                                        Escaped(stats.set_aside_dir));
      }
    }
  } else if (o_.bucket_wins) {
    // A commit this disk does not know, in a gang: files the commit does not
    // name (another save's checkpoint-N/, say) must not be resumed from
    // beside it. Files it names are replaced by the download.
    auto ls = local_vs(m->files);
    if (!ls.ok()) return ls.status();
    std::set<std::string> named;
    for (auto const& e : m->files) named.insert(e.path);
    std::vector<std::string> extra;
    for (auto const& f : ls->changed) {
      if (!named.count(f)) extra.push_back(f);
    }
    if (!extra.empty()) {
      auto moved = SetAside(o_.checkpoint_dir, extra, o_, clock_.WallNow(), &stats.set_aside_dir);
      if (!moved.ok()) return moved.status();
      stats.set_aside = *moved;
      if (stats.bucket_won.empty()) stats.bucket_won = fmt::format("restoring commit #{} from the bucket", m->sequence);
      stats.bucket_won += fmt::format("; {} local file(s) it does not name are kept in {}", *moved,
                                      Escaped(stats.set_aside_dir));
    }
  }

  FileMap restored;
  auto s = DownloadCommit(*m, restored, stats, ctx, /*drop_stale=*/true);
  if (!s.ok()) return s;
  if (m->marker) {
    // The commit was complete by the trainer's own word: say so again, after
    // every file, so the restored tree counts as complete.
    if (auto mk = MarkCheckpointComplete(o_.checkpoint_dir); mk.ok()) {
      GiveToOwner(o_.checkpoint_dir + "/" + kCompleteMarker, o_, 0644);
    }
  }
  adopt(std::move(restored));
  if (auto w = RememberCommit(m->marker); !w.empty()) stats.state_warning = w;
  stats.seconds = Since(start, clock_);
  return stats;
}

// Puts every file of `m` into checkpoint_dir: parallel, each checked
// against the manifest's size and crc32c, files already there (same size and
// crc32c) kept as they are, so an interrupted restore or pull goes on where
// it stopped.
Status SyncEngine::DownloadCommit(const Manifest& manifest, FileMap& restored, RestoreStats& stats,
                                  const CallContext& caller_ctx, bool drop_stale) {
  const Manifest* m = &manifest;
  std::mutex stats_mu;
  auto const& entries = m->files;
  std::uint64_t total = 0;
  for (auto const& e : entries) total += e.size;
  ProgressMeter meter("restore", total, static_cast<int>(entries.size()), clock_, o_.progress_interval, progress_handler_);
  const CallContext counted = meter.Counting(caller_ctx);
  const CallContext& ctx = counted;
  auto attempt = [&] {
  return ParallelFor(entries.size(), o_.parallelism, [&](std::size_t i) -> Status {
    if (auto c = ctx.Check("restoring"); !c.ok()) return c;
    auto const& e = entries[i];
    auto target = o_.checkpoint_dir + "/" + e.path;
    if (auto p = MakeParentsNoSymlinks(o_.checkpoint_dir, e.path, o_); !p.ok()) return p;
    struct stat st {};
    bool have = lstat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) == e.size;
    if (have) {
      auto crc = FileCrc32c(target);
      have = crc.ok() && *crc == e.crc;
    }
    if (!have) {
      auto tmp = fmt::format("{}{}{}", target, kRestoreTmp, getpid());
      auto got = store_->DownloadToFile(e.object, tmp, e.size, ctx);
      if (!got.ok()) {
        unlink(tmp.c_str());
        return Status(got.status().code(), fmt::format("restoring {}: {}", Escaped(e.path), got.status().message()));
      }
      if (got->size != e.size || got->crc32c != e.crc) {
        unlink(tmp.c_str());
        return FailedPreconditionError(fmt::format("restoring {}: object {} does not match the manifest (size {} vs {}, crc32c {} vs {})",
                                                   Escaped(e.path), Escaped(e.object), got->size, e.size,
                                                   Crc32cToBase64(got->crc32c), Crc32cToBase64(e.crc)));
      }
      if (auto g = GiveToOwner(tmp, o_, 0644); !g.ok()) {
        unlink(tmp.c_str());
        return g;
      }
      // rename replaces a symlink at the target instead of following it.
      if (rename(tmp.c_str(), target.c_str()) != 0) {
        int err = errno;
        unlink(tmp.c_str());
        return ErrnoToStatus(err, "renaming into " + Escaped(target));
      }
      std::lock_guard slk(stats_mu);
      ++stats.files_downloaded;
      stats.bytes_downloaded += e.size;
    } else if (auto g = GiveToOwner(target, o_, st.st_mode & 07777); !g.ok()) {
      return g;
    }
    if (lstat(target.c_str(), &st) != 0) return ErrnoToStatus(errno, Escaped(target));
    std::lock_guard slk(stats_mu);
    restored[e.path] = Uploaded{e.size, Ns(st.st_mtim), e.crc, e.object, e.generation};
    return OkStatus();
  });
  };
  auto s = attempt();
  if (s.ok() || !IsNoSpace(s)) return s;
  if (drop_stale) {
    // No room for the download beside the local copy it replaces: that copy
    // is stale (the restore has decided the bucket's commit is what the
    // trainer starts from; newer work was set aside or kept before this), so
    // it goes first, and the download is tried once more.
    for (auto const& e : entries) {
      auto target = o_.checkpoint_dir + "/" + e.path;
      struct stat st {};
      if (lstat(target.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (static_cast<std::uint64_t>(st.st_size) == e.size) {
        auto crc = FileCrc32c(target);
        if (crc.ok() && *crc == e.crc) continue;  // already the commit's
      }
      if (unlink(target.c_str()) == 0) {
        ++stats.stale_dropped;
        stats.stale_dropped_bytes += static_cast<std::uint64_t>(st.st_size);
      }
    }
    if (stats.stale_dropped > 0) s = attempt();
    if (s.ok() || !IsNoSpace(s)) return s;
  }
  return Status(s.code(), s.message() + InTheWay(manifest));
}

// What holds the room a restore needs, for its error: free space, what is
// left to download, what earlier restores set aside, and the local files
// the commit does not name.
std::string SyncEngine::InTheWay(const Manifest& m) const {
  auto mib = [](std::uint64_t b) { return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20)); };
  std::uint64_t need = 0;
  std::set<std::string> named;
  for (auto const& e : m.files) {
    named.insert(e.path);
    struct stat st {};
    if (lstat((o_.checkpoint_dir + "/" + e.path).c_str(), &st) != 0 || static_cast<std::uint64_t>(st.st_size) != e.size) {
      need += e.size;
    }
  }
  std::string out = "; in the way:";
  struct statvfs vfs {};
  if (statvfs(o_.checkpoint_dir.c_str(), &vfs) == 0) {
    out += fmt::format(" {} free on the disk of {}, {} still to restore;",
                       mib(static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize), Escaped(o_.checkpoint_dir), mib(need));
  }
  auto aside = TreeBytes(o_.checkpoint_dir + "/" + kSetAsideDir);
  if (aside > 0) {
    out += fmt::format(" {} in {}/{}, set aside by earlier restores (look at them, then delete what you do not need);",
                       mib(aside), Escaped(o_.checkpoint_dir), kSetAsideDir);
  }
  if (auto scan = ScanTree(o_.checkpoint_dir); scan.ok()) {
    std::vector<std::pair<std::uint64_t, std::string>> extra;
    std::uint64_t extra_bytes = 0;
    for (auto const& f : scan->files) {
      if (named.count(f.rel)) continue;
      extra.emplace_back(f.st.size, f.rel);
      extra_bytes += f.st.size;
    }
    if (!extra.empty()) {
      std::sort(extra.rbegin(), extra.rend());
      std::string names;
      for (std::size_t i = 0; i < extra.size() && i < 3; ++i) {
        names += fmt::format("{}\"{}\" {}", i ? ", " : "", Escaped(extra[i].second), mib(extra[i].first));
      }
      out += fmt::format(" {} local file(s) the commit does not name hold {} (largest: {});", extra.size(), mib(extra_bytes),
                         names);
    }
  }
  out.pop_back();
  return out + ". The checkpoint-dir's disk must hold the commit: make room or give it a bigger disk";
}

std::string SyncEngine::RememberCommit(bool marker, const Pending* pending) {
  if (o_.state_file.empty()) return "";
  auto list = [](const FileMap& m) {
    Json files = Json::array();
    for (auto const& [path, u] : m) {
      files.push_back({{"path", path}, {"object", u.object}, {"size", u.size}, {"crc32c", Crc32cToBase64(u.crc32c)},
                       {"generation", u.generation}, {"mtime_ns", u.mtime_ns}});
    }
    return files;
  };
  Json files = list(state_);
  struct stat dst {};
  if (stat(o_.checkpoint_dir.c_str(), &dst) != 0) return "cannot remember the commit: " + Escaped(o_.checkpoint_dir) + " is gone";
  Json j = {{"version", 1},
            {"run_id", o_.run_id},
            {"store", store_->Describe()},
            {"checkpoint_dir", o_.checkpoint_dir},
            {"dir_dev", static_cast<std::int64_t>(dst.st_dev)},
            {"dir_ino", static_cast<std::int64_t>(dst.st_ino)},
            {"commit_id", commit_id_},
            {"sequence", sequence_},
            {"generation", manifest_generation_},
            {"marker", marker},
            {"files", files}};
  if (pending) {
    j["pending"] = {{"commit_id", pending->commit_id}, {"sequence", pending->sequence}, {"marker", pending->marker},
                    {"files", list(pending->files)}};
  }
  std::lock_guard lk(record_mu_);
  return WriteRecord(std::move(j));
}

std::string SyncEngine::WriteRecord(Json j) {
  j["trainer_running"] = trainer_running_;
  auto s = WriteFileAtomically(o_.state_file, Dump(j));
  record_ = std::move(j);
  return s.ok() ? "" : "could not remember the commit in " + o_.state_file + ": " + s.message();
}

void SyncEngine::RememberLogs() {
  auto writers = FilesOpenForWriting(o_.checkpoint_dir);
  std::lock_guard lk(logs_mu_);
  for (auto const& [rel, appending] : writers) {
    if (appending) logs_.insert(rel);
  }
}

std::string SyncEngine::SettleWarning(const completeness::Verdict& v, bool uses_marker) const {
  auto names = [&] {
    std::string out;
    for (std::size_t i = 0; i < v.holding.size(); ++i) out += (i ? ", " : "") + fmt::format("\"{}\"", v.holding[i]);
    if (v.holding_more > 0) out += fmt::format(" and {} more", v.holding_more);
    return out;
  };
  std::string head = fmt::format("the last {} periodic syncs found {} mid-save ({}), so nothing newer than commit #{} is in "
                                 "the bucket. ",
                                 deferrals_, Escaped(o_.checkpoint_dir), v.why, sequence_);
  if (v.open_file_holds) {
    return head + fmt::format("{} stay open for writing: a file the trainer keeps open (a log, a metrics file) belongs "
                              "outside the checkpoint dir, or opened for appending (Python's open(path, \"a\")), which "
                              "spotvisor takes for a log that never holds a sync back",
                              names());
  }
  if (uses_marker) {
    return head + fmt::format("The trainer uses the completion marker, and {} keep changing after it: touch {}/{} after "
                              "the last file of each save (a file written later belongs to the next save), or save less "
                              "often",
                              names(), Escaped(o_.checkpoint_dir), kCompleteMarker);
  }
  return head + fmt::format("Touch {}/{} after each complete save (`spotvisor checkpoint --done`, or in Python "
                            "time.sleep(0.02); pathlib.Path(os.environ[\"SPOTVISOR_CHECKPOINT_MARKER\"]).touch()), or "
                            "save one file replaced by a rename (write NAME.tmp, then os.replace), or save less often "
                            "than sync-settle, or lower sync-settle",
                            Escaped(o_.checkpoint_dir), kCompleteMarker);
}

std::string SyncEngine::NoteTrainerRunning(bool running) {
  if (!running) {
    trainer_ended_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.WallNow().time_since_epoch()).count();
  }
  std::lock_guard lk(record_mu_);
  trainer_running_ = running;
  // Nothing recorded yet (no state-dir, or no restore ran): nothing to mark.
  if (o_.state_file.empty() || !record_.is_object()) return "";
  return WriteRecord(record_);
}

StatusOr<RestoreStats> SyncEngine::Pull(std::optional<std::int64_t> sequence, const CallContext& ctx) {
  std::lock_guard lk(mu_);
  auto start = clock_.Now();
  RestoreStats stats;
  auto text = store_->ReadBytes(kManifest, nullptr, ctx);
  if (!text.ok()) {
    if (text.status().code() != StatusCode::kNotFound) return text.status();
    return NotFoundError(fmt::format("{} has no {}: nothing was committed to this run (`spotvisor runs` lists the runs "
                                     "and their ids)",
                                     store_->Describe(), kManifest));
  }
  auto m = ParseManifest(*text, store_->Describe() + "/" + kManifest, o_.checkpoint_dir);
  if (!m.ok()) return m.status();
  if (sequence && *sequence != m->sequence) {
    return NotFoundError(fmt::format("commit #{} is not kept: the bucket holds only a run's newest commit (#{}); the "
                                     "objects of older ones are deleted after each commit",
                                     *sequence, m->sequence));
  }
  std::error_code ec;
  fs::create_directories(o_.checkpoint_dir, ec);
  if (ec) return ErrnoToStatus(ec.value(), "creating " + Escaped(o_.checkpoint_dir));
  auto done = store_->ReadBytes(kDone, nullptr, ctx);
  stats.done = done.ok();
  if (done.ok()) {
    stats.done_marker = Json::parse(*done, nullptr, false);
    if (stats.done_marker.is_discarded()) stats.done_marker = nullptr;
  }
  // The directory ends up holding exactly this commit (issue #28): what an
  // earlier pull put here, unedited, is removed where this commit no longer
  // holds it or holds another version; anything else that is not this
  // commit's (edited here, or never pulled) is set aside, never lost.
  RemoveStaleRestoreTemps(o_.checkpoint_dir, stats.stale_temps_removed, stats.stale_temp_bytes);
  auto record_path = o_.checkpoint_dir + "/" + kPullRecord;
  std::map<std::string, std::pair<std::uint64_t, std::int64_t>> pulled_before;  // path -> size, mtime
  if (auto before = ReadSmallFile(record_path); before) {
    auto j = Json::parse(*before, nullptr, false);
    if (j.is_object() && j.contains("files") && j["files"].is_array()) {
      for (auto const& f : j["files"]) {
        if (!f.is_object() || !f.contains("path") || !f["path"].is_string()) continue;
        auto sz = GetInt(f, "size");
        auto mt = GetInt(f, "mtime_ns");
        if (sz && mt) pulled_before[f["path"].get<std::string>()] = {static_cast<std::uint64_t>(*sz), *mt};
      }
    }
  }
  std::map<std::string, const ManifestEntry*> named;
  for (auto const& e : m->files) named[e.path] = &e;
  std::vector<std::string> aside;
  auto walk = WalkAll(o_.checkpoint_dir);
  if (!walk.ok()) return walk.status();
  for (auto const& [rel, st] : *walk) {
    if (rel == kPullRecord) continue;
    auto it = named.find(rel);
    if (it != named.end() && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) == it->second->size) {
      auto crc = FileCrc32c(o_.checkpoint_dir + "/" + rel);
      if (crc.ok() && *crc == it->second->crc) continue;  // already this commit's
    }
    auto was = pulled_before.find(rel);
    bool unedited = was != pulled_before.end() && S_ISREG(st.st_mode) &&
                    was->second == std::make_pair(static_cast<std::uint64_t>(st.st_size), Ns(st.st_mtim));
    if (unedited) {
      if (unlink((o_.checkpoint_dir + "/" + rel).c_str()) != 0 && errno != ENOENT) {
        return ErrnoToStatus(errno, "removing " + Escaped(o_.checkpoint_dir + "/" + rel));
      }
      ++stats.pull_removed;
      for (auto d = fs::path(rel).parent_path(); !d.empty(); d = d.parent_path()) {
        if (rmdir((o_.checkpoint_dir + "/" + d.string()).c_str()) != 0) break;
      }
    } else {
      aside.push_back(rel);
    }
  }
  auto moved = SetAside(o_.checkpoint_dir, aside, o_, clock_.WallNow(), &stats.set_aside_dir, kPullSetAsideDir);
  if (!moved.ok()) return moved.status();
  stats.set_aside = *moved;
  FileMap pulled;
  if (auto s = DownloadCommit(*m, pulled, stats, ctx); !s.ok()) return s;
  // What this pull put here, so that the next one knows an unedited file.
  Json files = Json::array();
  for (auto const& [path, u] : pulled) files.push_back({{"path", path}, {"size", u.size}, {"mtime_ns", u.mtime_ns}});
  Json rec = {{"version", 1}, {"store", store_->Describe()}, {"sequence", m->sequence}, {"files", files}};
  if (auto w = WriteFileAtomically(record_path, Dump(rec, 1) + "\n", 0644); !w.ok()) stats.state_warning = w.message();
  stats.resumed = true;
  stats.files = static_cast<int>(m->files.size());
  stats.sequence = m->sequence;
  stats.seconds = Since(start, clock_);
  return stats;
}

Status SyncEngine::PublishRunStatus(const Json& status, const CallContext& ctx) {
  if (auto f = Fenced(); !f.empty()) return FailedPreconditionError(f);
  auto r = store_->UploadBytes(kRunStatus, Dump(status, 1) + "\n", {}, ctx);
  return r.ok() ? OkStatus() : r.status();
}

std::string SyncEngine::Publish(const std::string& committed_at, const std::string& instance) {
  CommittedView v;
  v.known = true;
  v.sequence = sequence_;
  v.committed_at = committed_at;
  v.committed_time = ParseRfc3339(committed_at);
  v.instance = instance;
  v.files = static_cast<int>(state_.size());
  std::map<std::string, std::pair<std::uint64_t, std::int64_t>> files;
  Json list = Json::array();
  for (auto const& [path, u] : state_) {
    v.bytes += u.size;
    files.emplace(path, std::make_pair(u.size, u.mtime_ns));
    list.push_back({{"path", path}, {"size", u.size}});
  }
  {
    std::lock_guard lk(view_mu_);
    view_ = v;
    view_files_ = std::move(files);
  }
  if (o_.committed_file.empty()) return "";
  // For the trainer: which of its files the bucket holds, and since when.
  Json j = {{"version", 1},
            {"run_id", o_.run_id},
            {"bucket", store_->Describe()},
            {"checkpoint_dir", o_.checkpoint_dir},
            {"sequence", v.sequence},
            {"committed_at", v.sequence > 0 ? Json(committed_at) : Json(nullptr)},
            {"instance", v.sequence > 0 ? Json(instance) : Json(nullptr)},
            {"file_count", v.files},
            {"bytes", v.bytes},
            {"files", std::move(list)}};
  auto s = WriteFileAtomically(o_.committed_file, Dump(j, 1) + "\n", 0644);
  return s.ok() ? "" : "could not write " + o_.committed_file + ": " + s.message();
}

CommittedView SyncEngine::Committed() const {
  std::lock_guard lk(view_mu_);
  return view_;
}

StatusOr<UncommittedView> SyncEngine::Uncommitted() const {
  auto scan = ScanTree(o_.checkpoint_dir);
  if (!scan.ok()) return scan.status();
  UncommittedView u;
  std::lock_guard lk(view_mu_);
  std::size_t matched = 0;
  for (auto const& f : scan->files) {
    auto it = view_files_.find(f.rel);
    if (it != view_files_.end()) ++matched;
    if (it == view_files_.end() || it->second.first != f.st.size || it->second.second != f.st.mtime_ns) {
      ++u.files;
      u.bytes += f.st.size;
    }
  }
  // Files the commit holds that are gone here: the next commit drops them.
  u.files += static_cast<int>(view_files_.size() - matched);
  return u;
}

Status SyncEngine::Commit(std::int64_t seq, const FileMap& next, bool marker, const CallContext& ctx) {
  std::string id = RandomHex(16);
  Json files = Json::array();
  for (auto const& [path, u] : next) {
    files.push_back({{"path", path}, {"object", u.object}, {"size", u.size}, {"crc32c", Crc32cToBase64(u.crc32c)},
                     {"generation", u.generation}});
  }
  std::string committed_at = FormatRfc3339(clock_.WallNow());
  Json manifest = {{"version", 2},
                   {"run_id", o_.run_id},
                   {"sequence", seq},
                   {"instance", o_.instance},
                   {"commit_id", id},
                   {"committed_at", committed_at},
                   {"marker", marker},
                   {"files", files}};
  std::string text = Dump(manifest, 1);
  {
    // Written ahead: if spotvisor dies with this commit in flight and it
    // lands, the next start recognises it as this disk's own.
    Pending ahead{id, seq, next, marker};
    RememberCommit(marker_committed_, &ahead);
  }
  auto adopt = [&](std::int64_t generation) {
    manifest_generation_ = generation;
    sequence_ = seq;
    state_ = next;
    commit_id_ = id;
    marker_committed_ = marker;
    pending_.reset();
    publish_warning_ = Publish(committed_at, o_.instance);
  };
  for (int round = 0; round < 2; ++round) {
    auto committed = store_->UploadBytes(kManifest, text, Precondition{manifest_generation_}, ctx);
    if (committed.ok()) {
      adopt(committed->generation);
      return OkStatus();
    }
    if (committed.status().code() != StatusCode::kFailedPrecondition) {
      // The write may have landed with its answer lost: the next commit
      // recognises it by its id.
      pending_ = Pending{id, seq, next, marker};
      return committed.status();
    }
    // 412: whose manifest is it? Ours (a retry after a lost answer), an
    // earlier commit of ours whose answer never came, or another VM's.
    ObjectInfo info;
    auto current = store_->ReadBytes(kManifest, &info, ctx);
    if (!current.ok()) {
      pending_ = Pending{id, seq, next, marker};
      return Status(current.status().code(), "the commit's precondition failed and the manifest cannot be read back: " +
                                                 current.status().message());
    }
    auto theirs = ParseManifest(*current, store_->Describe() + "/" + kManifest, o_.checkpoint_dir);
    std::string their_id = theirs.ok() ? theirs->commit_id : "";
    if (!their_id.empty() && their_id == id) {
      adopt(info.generation);
      return OkStatus();
    }
    if (round == 0 && pending_ && !their_id.empty() && their_id == pending_->commit_id) {
      // The earlier commit did land: it is what we build on.
      state_ = pending_->files;
      sequence_ = pending_->sequence;
      commit_id_ = pending_->commit_id;
      marker_committed_ = pending_->marker;
      manifest_generation_ = info.generation;
      pending_.reset();
      publish_warning_ = Publish(theirs->committed_at, theirs->instance);
      continue;
    }
    std::string who = theirs.ok() ? fmt::format("instance \"{}\" committed checkpoint #{} at {}", theirs->instance,
                                                theirs->sequence, theirs->committed_at)
                                  : std::string("something else rewrote it");
    std::string msg = fmt::format(
        "{}/{} changed since this VM last committed or restored it: another VM is using run-id \"{}\" ({}). This VM "
        "stops syncing so it cannot overwrite that checkpoint; its own progress since commit #{} is not uploaded. "
        "Stop one of the two VMs, or give each run its own spotvisor-run-id",
        store_->Describe(), kManifest, Escaped(o_.run_id), who, sequence_);
    {
      std::lock_guard flk(fence_mu_);
      fenced_ = msg;
    }
    return FailedPreconditionError(msg);
  }
  return FailedPreconditionError("the manifest kept changing under the commit");
}

void SyncEngine::CollectGarbage(std::int64_t seq, const CallContext& ctx, SyncStats& stats) {
  // Objects no manifest names any more (older versions, uploads of syncs
  // that never committed) and that no later sync can be using: only names
  // with a sequence up to this commit's. Another VM that restored this
  // commit uploads under higher sequences. Failure costs storage, not safety.
  std::set<std::string> live;
  for (auto const& [p, u] : state_) live.insert(u.object);
  if (!o_.pinned_prefix.empty()) {
    // Shares of gang checkpoint sets: what they name stays. Any doubt
    // (a share that cannot be read) and nothing is collected this time.
    auto pins = store_->List(o_.pinned_prefix, ctx);
    if (!pins.ok()) return;
    for (auto const& pin : *pins) {
      auto text = store_->ReadBytes(pin.name, nullptr, ctx);
      if (!text.ok()) return;
      auto j = Json::parse(*text, nullptr, false);
      if (auto e = j.is_object() ? j.find("empty") : j.end(); e != j.end() && e->is_boolean() && e->get<bool>()) continue;
      auto m = ParseManifest(*text, store_->Describe() + "/" + pin.name, o_.checkpoint_dir);
      if (!m.ok()) return;
      for (auto const& e : m->files) live.insert(e.object);
    }
  }
  auto listed = store_->List(kObjectsDir, ctx);
  if (!listed.ok()) return;
  for (auto const& o : *listed) {
    if (live.count(o.name)) continue;
    auto oseq = ObjectSequence(o.name);
    if (!oseq || *oseq > seq) continue;
    if (store_->Delete(o.name, Precondition{o.generation}, ctx).ok()) ++stats.files_deleted;
  }
}

StatusOr<SyncStats> SyncEngine::Sync(bool final, const CallContext& ctx) {
  // Kept for callers that only know "final or not": a final sync after a
  // clean exit takes the tree as it is.
  return Sync(final ? SyncKind::kCompleted : SyncKind::kPeriodic, ctx);
}

StatusOr<SyncStats> SyncEngine::Sync(SyncKind kind, const CallContext& ctx) {
  std::lock_guard lk(mu_);
  if (!restored_) {
    return FailedPreconditionError("not syncing: the checkpoint was never restored, so the bucket may hold a newer one");
  }
  if (auto f = Fenced(); !f.empty()) return FailedPreconditionError(f);
  const bool periodic = kind == SyncKind::kPeriodic;
  auto start = clock_.Now();
  SyncStats stats;
  std::int64_t seq = std::max(sequence_, pending_ ? pending_->sequence : 0) + 1;
  std::string nonce = RandomHex(8);
  const std::string& root = o_.checkpoint_dir;
  auto quiet = std::max(std::chrono::milliseconds(20), o_.settle / 10);
  // Uploads already made in this sync, reused by a later snapshot if the
  // file is still the same version.
  std::map<std::string, std::pair<FileStat, ObjectInfo>> uploaded;
  std::mutex up_mu;
  bool can_stage = periodic;
  auto staging_root = fmt::format("{}/{}", root, kStagingDir);
  struct StagingCleanup {
    std::string dir;
    ~StagingCleanup() {
      std::error_code ec;
      fs::remove_all(dir, ec);
    }
  } cleanup{staging_root};

  auto unchanged_since_commit = [&](const ScanEntry& e) {
    auto it = state_.find(e.rel);
    return it != state_.end() && it->second.size == e.st.size && it->second.mtime_ns == e.st.mtime_ns;
  };
  // Both sides are sorted by path, so "nothing changed" (the common answer)
  // is one linear pass with no lookups and no copies.
  auto same_as_committed = [&](const Scan& sc) {
    if (sc.files.size() != state_.size()) return false;
    auto it = state_.begin();
    for (auto const& e : sc.files) {
      if (it->first != e.rel || it->second.size != e.st.size || it->second.mtime_ns != e.st.mtime_ns) return false;
      ++it;
    }
    return true;
  };
  auto finish = [&](std::int64_t sequence) {
    stats.files_total = static_cast<int>(state_.size());
    stats.sequence = sequence;
    stats.seconds = Since(start, clock_);
    return stats;
  };

  // The facts the rules judge by: the scan, the marker, the last commit,
  // the trainer's state, and for files changed since the commit, whether a
  // process holds them open for writing and what their format says.
  auto Facts = [&](const Scan& sc, SyncKind k) {
    completeness::Facts f;
    f.trainer = k == SyncKind::kPeriodic ? completeness::Trainer::kRunning
                : k == SyncKind::kKilled ? completeness::Trainer::kKilled
                : k == SyncKind::kStopped ? completeness::Trainer::kExited
                                          : completeness::Trainer::kCompleted;
    f.now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.WallNow().time_since_epoch()).count();
    f.trainer_ended_ns = trainer_ended_ns_.load();
    f.settle_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(o_.settle).count();
    if (sc.marker) f.marker_ns = sc.marker->mtime_ns;
    for (auto const& [rel, u] : state_) f.committed.emplace_hint(f.committed.end(), rel, completeness::CommittedFile{u.size, u.mtime_ns});
    std::map<std::string, bool> writers;
    if (k == SyncKind::kPeriodic && o_.check_open_files) writers = FilesOpenForWriting(root);
    std::set<std::string> logs;
    {
      std::lock_guard llk(logs_mu_);
      for (auto const& [rel, appending] : writers) {
        if (appending) logs_.insert(rel);
      }
      logs = logs_;
    }
    f.files.reserve(sc.files.size());
    for (auto const& e : sc.files) {
      completeness::File file;
      file.rel = e.rel;
      file.size = e.st.size;
      file.mtime_ns = e.st.mtime_ns;
      file.ino = e.st.ino;
      if (auto w = writers.find(e.rel); w != writers.end()) {
        file.open_for_writing = true;
        file.appending = w->second;
      }
      file.appending = file.appending || logs.count(e.rel) > 0;
      if (k != SyncKind::kCompleted && !unchanged_since_commit(e)) {
        file.format = ProbeFormat(root + "/" + e.rel, completeness::ProbeFor(e.rel), &file.pointer);
      }
      f.files.push_back(std::move(file));
    }
    // A one-file saver shows itself by replacing its only file (a new
    // inode, size or time) while it stays the only one.
    std::vector<const completeness::File*> saves;
    for (auto const& file : f.files) {
      if (!file.appending && !completeness::IsLogName(file.rel)) saves.push_back(&file);
    }
    if (saves.size() == 1) {
      auto const& only = *saves.front();
      std::tuple<std::uint64_t, std::int64_t, std::uint64_t> id{only.ino, only.mtime_ns, only.size};
      if (one_file_rel_ != only.rel) {
        one_file_rel_ = only.rel;
        one_file_versions_ = 1;
      } else if (id != one_file_id_) {
        one_file_versions_ = std::min(one_file_versions_ + 1, 1000);
      }
      one_file_id_ = id;
    } else {
      one_file_rel_.clear();
      one_file_versions_ = 0;
    }
    f.one_file_versions = one_file_versions_;
    return f;
  };

  const int max_attempts = periodic ? 4 : 3;
  const int max_scans = periodic ? 8 : 1;
  for (int attempt = 0; attempt < max_attempts; ++attempt) {
    stats.attempts = attempt + 1;
    // 1. A snapshot of the tree, and what of it may be committed
    // (sync/completeness.h decides; this gathers the facts).
    Scan scan;
    completeness::Verdict verdict;
    bool nothing_new = false;
    for (int n = 0;; ++n) {
      if (auto c = ctx.Check("syncing"); !c.ok()) return c;
      auto sc = ScanTree(root);
      if (!sc.ok()) return sc.status();
      scan = std::move(*sc);
      if (kind != SyncKind::kCompleted && same_as_committed(scan)) {
        nothing_new = true;
        break;
      }
      verdict = completeness::Judge(Facts(scan, kind));
      if (verdict.complete || n + 1 >= max_scans) break;
      bool slept = Wait(quiet, ctx);
      if (!slept) return ctx.Check("syncing").ok() ? CancelledError("syncing: cancelled") : ctx.Check("syncing");
    }
    for (auto const& name : scan.unstorable) {
      if (warned_names_.insert(name).second) stats.skipped_names.push_back(Escaped(name));
    }
    if (nothing_new) {
      // The committed manifest already says all there is to say.
      deferrals_ = 0;
      stats.judged_by = "unchanged";
      stats.uncommitted = UncommittedView{};  // nothing: the caller need not scan again
      return finish(sequence_);
    }

    // 2. What this commit holds: the files taken as they are now (those
    // changed since the last commit are uploaded), and the committed
    // version of any save that is not whole now.
    UncommittedView at_risk;
    std::vector<const ScanEntry*> all_changed;
    for (auto const& e : scan.files) {
      if (!unchanged_since_commit(e)) all_changed.push_back(&e);
    }
    {
      std::set<std::string> present;
      for (auto const& e : scan.files) present.insert(e.rel);
      int gone = 0;
      for (auto const& [rel, u] : state_) gone += present.count(rel) == 0;
      at_risk.files = static_cast<int>(all_changed.size()) + gone;
    }
    for (auto const* e : all_changed) at_risk.bytes += e->st.size;
    if (!verdict.complete) {
      stats.uncommitted = at_risk;
      stats.deferred = true;
      stats.deferred_reason = verdict.why;
      stats.files_deferred = static_cast<int>(all_changed.size());
      if (periodic && ++deferrals_ >= o_.warn_after_deferrals && !settle_warned_) {
        settle_warned_ = true;
        stats.settle_warning = SettleWarning(verdict, scan.marker.has_value() || marker_committed_);
      }
      if (!periodic) {
        stats.not_uploaded.reserve(all_changed.size());
        for (auto const* e : all_changed) stats.not_uploaded.push_back(Escaped(e->rel));
      }
      return finish(sequence_);
    }
    stats.judged_by = verdict.by;
    Scan taken;  // the files of this snapshot taken as they are
    for (auto const& e : scan.files) {
      if (std::binary_search(verdict.take.begin(), verdict.take.end(), e.rel)) taken.files.push_back(e);
    }
    FileMap next;
    std::vector<const ScanEntry*> changed;
    for (auto const& e : taken.files) {
      auto prev = state_.find(e.rel);
      if (prev != state_.end() && prev->second.size == e.st.size && prev->second.mtime_ns == e.st.mtime_ns) {
        next[e.rel] = prev->second;
      } else {
        changed.push_back(&e);
      }
    }
    for (auto const& rel : verdict.keep) {
      if (auto it = state_.find(rel); it != state_.end()) next[rel] = it->second;
    }
    bool removed = next.size() != state_.size();
    if (next.empty() && changed.empty() && !state_.empty() && kind != SyncKind::kCompleted) {
      // An empty checkpoint dir is not a checkpoint: never commit it over one.
      stats.deferred = true;
      stats.deferred_reason = "the checkpoint dir is empty";
      return finish(sequence_);
    }
    if (changed.empty() && !removed) {
      // Only saves that are not whole changed: the commit stands as it is.
      deferrals_ = 0;
      stats.uncommitted = at_risk;
      return finish(sequence_);
    }
    stats.left_out = verdict.left_out;

    // 3. After an upload saw the tree change under it, copy the snapshot
    // locally first (fast), check it is still one state, and upload the copy.
    bool stage = can_stage && attempt > 0;
    std::map<std::string, std::string> source;
    if (stage) {
      std::error_code ec;
      fs::remove_all(staging_root, ec);
      Status copied;
      for (auto const* e : changed) {
        auto dst = fmt::format("{}/{}", staging_root, e->rel);
        fs::create_directories(fs::path(dst).parent_path(), ec);
        if (ec) {
          copied = ErrnoToStatus(ec.value(), "creating " + Escaped(fs::path(dst).parent_path().string()));
          break;
        }
        copied = CopyFile(root + "/" + e->rel, dst);
        if (!copied.ok()) break;
        source[e->rel] = dst;
      }
      if (!copied.ok()) {
        if (LstatRegular(root + "/" + changed.front()->rel) || copied.code() != StatusCode::kNotFound) {
          // No room for a copy (or no permission): upload directly instead.
          can_stage = false;
          stage = false;
          source.clear();
          fs::remove_all(staging_root, ec);
        } else {
          continue;  // a file vanished: the tree moved on, take a new snapshot
        }
      } else if (!Unchanged(root, taken)) {
        continue;
      } else {
        stats.staged = true;
      }
    }

    // 4. Upload, newest first: if time runs out, what is missing is older.
    std::sort(changed.begin(), changed.end(), [](auto* a, auto* b) { return a->st.mtime_ns > b->st.mtime_ns; });
    std::atomic<bool> moved{false};
    std::vector<char> done(changed.size(), 0);
    FileMap fresh;
    std::uint64_t bytes = 0;
    int count = 0;
    int files_at_once = ctx.urgent && o_.urgent_parallelism > 0 ? o_.urgent_parallelism : o_.parallelism;
    std::uint64_t to_send = 0;
    for (auto const* e : changed) to_send += e->st.size;
    ProgressMeter meter("sync", to_send, static_cast<int>(changed.size()), clock_, o_.progress_interval,
                        progress_handler_);
    const CallContext upload_ctx = meter.Counting(ctx);
    auto up = ParallelFor(changed.size(), files_at_once, [&](std::size_t i) -> Status {
      if (moved.load()) return OkStatus();
      auto const& e = *changed[i];
      auto path = root + "/" + e.rel;
      {
        std::lock_guard ulk(up_mu);
        auto it = uploaded.find(e.rel);
        if (it != uploaded.end() && it->second.first == e.st) {
          fresh[e.rel] = Uploaded{e.st.size, e.st.mtime_ns, it->second.second.crc32c, it->second.second.name,
                                  it->second.second.generation};
          done[i] = 1;
          return OkStatus();
        }
      }
      auto object = fmt::format("{}{}~{}.{}", kObjectsDir, e.rel, seq, nonce);
      auto from = stage ? source[e.rel] : path;
      auto r = store_->UploadFile(object, from, {}, upload_ctx);
      auto after = LstatRegular(path);
      if (!r.ok() && r.status().code() != StatusCode::kNotFound) ++abandoned_uploads_;
      if (!r.ok()) {
        // The file vanished or changed under the read: not this snapshot.
        if (!stage && (!after || *after != e.st || r.status().code() == StatusCode::kFailedPrecondition)) {
          moved = true;
          return OkStatus();
        }
        return Status(r.status().code(), fmt::format("uploading {}: {}", Escaped(e.rel), r.status().message()));
      }
      if (!stage && (!after || *after != e.st || r->size != e.st.size)) {
        moved = true;
        return OkStatus();
      }
      std::lock_guard ulk(up_mu);
      uploaded[e.rel] = {e.st, *r};
      fresh[e.rel] = Uploaded{r->size, e.st.mtime_ns, r->crc32c, object, r->generation};
      done[i] = 1;
      bytes += r->size;
      ++count;
      return OkStatus();
    });
    stats.bytes_uploaded += bytes;
    stats.files_uploaded += count;
    if (!up.ok()) {
      for (std::size_t i = 0; i < changed.size(); ++i) {
        if (!done[i]) stats.not_uploaded.push_back(Escaped(changed[i]->rel));
      }
      if (!periodic && !stats.not_uploaded.empty()) {
        return Status(up.code(), fmt::format("{}; not uploaded: {}; the bucket keeps commit #{}", up.message(),
                                             JoinNames(stats.not_uploaded), sequence_));
      }
      return up;
    }
    // 5. The snapshot holds only if no file of it changed meanwhile.
    if (moved.load() || (!stage && !Unchanged(root, taken))) continue;

    // 6. Commit. files_uploaded counts the new objects this commit names
    // (bytes_uploaded counts every byte sent, earlier snapshots' too).
    stats.files_uploaded = static_cast<int>(fresh.size());
    for (auto& [rel, u] : fresh) next[rel] = u;
    // The manifest's `marker`: the trainer uses the completion marker (judged
    // by it, or it was there), so a restore puts it back. Sticky: a VM that
    // restores a marker-using run must not judge that run's saves by
    // sync-settle alone.
    bool uses_marker = verdict.by == "marker" || scan.marker.has_value() || marker_committed_;
    if (auto c = Commit(seq, next, uses_marker, ctx); !c.ok()) return c;
    deferrals_ = 0;
    stats.state_warning = RememberCommit(marker_committed_);
    if (stats.state_warning.empty()) stats.state_warning = publish_warning_;
    publish_warning_.clear();
    if (!ctx.urgent) CollectGarbage(seq, ctx, stats);
    stats.files_total = static_cast<int>(state_.size());
    stats.sequence = seq;
    stats.seconds = Since(start, clock_);
    return stats;
  }
  // Every snapshot changed under its upload.
  std::string why = fmt::format("the checkpoint changed under each of {} snapshots", max_attempts);
  if (!periodic) {
    return UnavailableError(why + fmt::format(": something is still writing into {}; the bucket keeps commit #{}",
                                              Escaped(root), sequence_));
  }
  stats.deferred = true;
  stats.deferred_reason = why;
  stats.files_total = static_cast<int>(state_.size());
  stats.sequence = sequence_;
  stats.seconds = Since(start, clock_);
  return stats;
}

Status SyncEngine::WriteDone(int exit_code, const CallContext& ctx, bool* already) {
  std::lock_guard lk(mu_);
  if (auto f = Fenced(); !f.empty()) return FailedPreconditionError(f);
  Json done = {{"exit_code", exit_code}, {"time", FormatRfc3339(clock_.WallNow())}, {"instance", o_.instance},
               {"run_id", o_.run_id}, {"sequence", sequence_}, {"commit_id", commit_id_}};
  auto r = store_->UploadBytes(kDone, Dump(done) + "\n", o_.done_once ? Precondition{0} : Precondition{}, ctx);
  if (!r.ok() && !(o_.done_once && r.status().code() == StatusCode::kFailedPrecondition)) return r.status();
  if (already) *already = !r.ok();
  // The run is over and no VM trains it again: every object the final
  // manifest does not name is garbage, whatever its sequence (uploads of
  // syncs cut off by a kill, before or after the last commit).
  SyncStats ignored;
  CollectGarbage(std::numeric_limits<std::int64_t>::max(), ctx, ignored);
  // An abandoned upload may land after that listing (issue #11, soak seed
  // 5111): one more pass a little later. A later boot that finds DONE
  // collects again (CollectAfterDone) for anything later still.
  if (abandoned_uploads_.load() > 0 && o_.late_collection.count() > 0 && Wait(o_.late_collection, ctx)) {
    CollectGarbage(std::numeric_limits<std::int64_t>::max(), ctx, ignored);
  }
  return OkStatus();
}

bool SyncEngine::Wait(std::chrono::milliseconds d, const CallContext& ctx) const {
  return o_.sleeper ? o_.sleeper->SleepFor(d) : ctx.SleepFor(d);
}

int SyncEngine::CollectAfterDone(const CallContext& ctx) {
  auto text = store_->ReadBytes(kManifest, nullptr, ctx);
  std::set<std::string> live;
  if (text.ok()) {
    auto m = ParseManifest(*text, store_->Describe() + "/" + kManifest, o_.checkpoint_dir);
    if (!m.ok()) return 0;  // never delete against a manifest that cannot be read
    for (auto const& f : m->files) live.insert(f.object);
  } else if (text.status().code() != StatusCode::kNotFound) {
    return 0;
  }
  auto listed = store_->List(kObjectsDir, ctx);
  if (!listed.ok()) return 0;
  int deleted = 0;
  for (auto const& o : *listed) {
    if (live.count(o.name) || !ObjectSequence(o.name)) continue;
    if (store_->Delete(o.name, Precondition{o.generation}, ctx).ok()) ++deleted;
  }
  return deleted;
}

std::optional<double> SyncProgress::Rate() const {
  if (bytes_done == 0 || elapsed_s <= 0) return std::nullopt;
  return static_cast<double>(bytes_done) / elapsed_s;
}

std::optional<double> SyncProgress::SecondsLeft() const {
  auto rate = Rate();
  if (!rate) return std::nullopt;
  return static_cast<double>(bytes_total - std::min(bytes_done, bytes_total)) / *rate;
}

}  // namespace spotvisor
