// Internals of the sync engine shared by its files (sync_engine.cc: scan,
// judgement, upload, commit; local_tree.cc: the local tree and files;
// restore.cc: restore and pull). Not an interface: nothing outside lib/sync
// includes it.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "sync/manifest.h"
#include "sync/sync_engine.h"

namespace spotvisor::sync_internal {

using Json = nlohmann::json;

inline constexpr const char* kManifest = kManifestObject;
inline constexpr const char* kDone = kDoneObject;
// GCS allows 1024 bytes for a whole object name; this leaves room for the
// bucket prefix, the run-id, "checkpoints/" and "~SEQ.NONCE".
inline constexpr std::size_t kMaxRelPath = 900;
inline constexpr int kMaxDepth = 64;
// File times advance in ticks of at most 10 ms; within one tick below the
// marker, a file may have been written before it or after it.
inline constexpr std::int64_t kTickNs = 10'000'000;
// `spotvisor pull`'s own names in the directory it pulls into.
inline constexpr const char* kPullRecord = ".spotvisor-pull.json";
inline constexpr const char* kPullSetAsideDir = ".spotvisor-replaced";

std::string Escaped(const std::string& s);
// JSON text of `j`; text from outside is escaped, never thrown on.
std::string Dump(const Json& j, int indent = -1);
std::string RandomHex(int bytes);
std::int64_t Ns(const timespec& t);
double Since(SteadyTime start, const Clock& clock);

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

FileStat StatOf(const struct stat& st);
std::optional<FileStat> LstatRegular(const std::string& path);

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

// Walks the tree (two passes: names, then lstat, on several threads when
// there are many). Symlinks are not followed; entries that vanish while we
// look are not part of this snapshot.
StatusOr<Scan> ScanTree(const std::string& root);
// Every file of the snapshot is still exactly as it was scanned.
bool Unchanged(const std::string& root, const Scan& scan);

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

StatusOr<std::uint32_t> FileCrc32c(const std::string& path);
// Copies src to dst (created), in the kernel where it can.
// copy_file_range, else read/write.
Status CopyFile(const std::string& src, const std::string& dst);
// A reflink (FICLONE: btrfs, XFS with reflink): dst shares src's blocks
// and takes no room until either changes. False where the file system
// cannot (dst is then removed).
bool CloneFile(const std::string& src, const std::string& dst);
// "" when a disk with `free` bytes (nullopt: cannot tell) keeps, after
// `more` bytes of copies, the trainer's largest save so far and a quarter
// more; else why not, with the numbers (SyncStats::not_staged).
std::string StagingRoomProblem(std::optional<std::uint64_t> free, std::uint64_t more, std::uint64_t largest_save);
// Creates dir/a/b/... for `rel`'s parent, refusing to pass through a symlink;
// new directories are given to the trainer's user.
Status MakeParentsNoSymlinks(const std::string& dir, const std::string& rel, const SyncOptions& o);
Status GiveToOwner(const std::string& path, const SyncOptions& o, mode_t mode);
// Writes `text` to `path` so that a crash leaves the old or the new file.
Status WriteFileAtomically(const std::string& path, const std::string& text, mode_t mode = 0600);
// Moves `move` into ROOT/FOLDER/TIME-PID/ (`*dir`), keeping earlier ones.
StatusOr<int> SetAside(const std::string& root, const std::vector<std::string>& move, const SyncOptions& o,
                       WallTime now, std::string* dir, const char* folder = kSetAsideDir);
// Removes the temporary files of restores that were killed mid-way.
void RemoveStaleRestoreTemps(const std::string& root, int& count, std::uint64_t& bytes);
bool IsNoSpace(const Status& s);
// A file of at most 64 MiB, whole; nullopt if it cannot be opened.
std::optional<std::string> ReadSmallFile(const std::string& path);
// Every entry under `root` that is not a directory, with its lstat.
StatusOr<std::vector<std::pair<std::string, struct stat>>> WalkAll(const std::string& root);
// Bytes under `dir` (regular files, not following symlinks).
std::uint64_t TreeBytes(const std::string& dir);
// "checkpoints/a/b~12.9f3c..." -> 12; legacy "checkpoints/a/b~12" -> 12.
std::optional<std::int64_t> ObjectSequence(const std::string& name);
std::string JoinNames(const std::vector<std::string>& names, std::size_t max = 10);

}  // namespace spotvisor::sync_internal
