#include "sync/engine_internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>

#include <fmt/format.h>

#include "common/parallel_for.h"
#include "common/random.h"
#include "common/strings.h"
#include "common/units.h"
#include "log/logger.h"
#include "output/utf8.h"
#include "storage/crc32c.h"
#include "sync/completeness.h"

namespace spotvisor::sync_internal {

namespace fs = std::filesystem;
std::string Escaped(const std::string& s) { return output::EscapeInvalidUtf8(s); }

// JSON text of `j`; text from outside is escaped, never thrown on.
std::string Dump(const Json& j, int indent) { return j.dump(indent, ' ', false, Json::error_handler_t::replace); }

std::string RandomHex(int bytes) {
  std::string out;
  while (static_cast<int>(out.size()) < bytes * 2) out += fmt::format("{:016x}", RandomSeed());
  return out.substr(0, static_cast<std::size_t>(bytes) * 2);
}

std::int64_t Ns(const timespec& t) { return static_cast<std::int64_t>(t.tv_sec) * 1'000'000'000 + t.tv_nsec; }


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



namespace {

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

}  // namespace

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
std::string StagingRoomProblem(std::optional<std::uint64_t> free, std::uint64_t more, std::uint64_t largest_save) {
  if (!free) return "";  // cannot tell: the copy's own ENOSPC still stops it
  auto need = largest_save + largest_save / 4;
  auto left = *free > more ? *free - more : 0;
  if (left >= need) return "";
  return fmt::format("not copying the checkpoint to stage it: that would leave {} free on the checkpoint disk, less "
                     "than the trainer's largest save so far ({}) and a quarter more; uploading the files in place "
                     "and taking a new snapshot if they change",
                     FormatBytes(left), FormatBytes(largest_save));
}

bool CloneFile(const std::string& src, const std::string& dst) {
  int in = open(src.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) return false;
  int out = open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (out < 0) {
    close(in);
    return false;
  }
  bool ok = ioctl(out, FICLONE, in) == 0;
  close(in);
  close(out);
  if (!ok) unlink(dst.c_str());
  return ok;
}

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
Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode) {
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
                       WallTime now, std::string* dir, const char* folder) {
  if (move.empty()) return 0;
  auto top = root + "/" + folder;
  struct stat st {};
  if (lstat(top.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    return FailedPreconditionError(fmt::format("{} is not a directory: move it away to let a restore set files aside",
                                               Escaped(top)));
  }
  if (mkdir(top.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "creating " + Escaped(top));
  if (auto g = GiveToOwner(top, o, 0755); !g.ok()) return g;
  auto stamp = FormatCompactUtc(now);
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

std::string JoinNames(const std::vector<std::string>& names, std::size_t max) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < max; ++i) out += (i ? ", " : "") + fmt::format("\"{}\"", Escaped(names[i]));
  if (names.size() > max) out += fmt::format(" and {} more", names.size() - max);
  return out;
}

}  // namespace spotvisor::sync_internal
