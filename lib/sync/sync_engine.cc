#include "sync/sync_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "common/strings.h"
#include "log/logger.h"
#include "storage/crc32c.h"

namespace spotvisor {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kManifest[] = "manifest.json";
constexpr char kDone[] = "DONE";
constexpr char kObjectsDir[] = "checkpoints/";
constexpr char kRestoreTmp[] = ".spotvisor-restore.";

std::int64_t MtimeNs(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

double Since(SteadyTime start, const Clock& clock) {
  return std::chrono::duration<double>(clock.Now() - start).count();
}

// Runs fn(i) for i in [0, n) on up to `parallelism` threads; returns the
// first error (the others still finish their current item).
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

StatusOr<std::uint32_t> FileCrc32c(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoToStatus(errno, path);
  char buf[1 << 16];
  std::uint32_t crc = 0;
  for (;;) {
    ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      close(fd);
      return ErrnoToStatus(err, path);
    }
    if (n == 0) break;
    crc = Crc32cExtend(crc, std::string_view(buf, static_cast<std::size_t>(n)));
  }
  close(fd);
  return crc;
}

// Creates dir/a/b/... for `rel`'s parent, refusing to pass through a symlink
// (a restored checkpoint must never be written outside the checkpoint dir).
Status MakeParentsNoSymlinks(const std::string& dir, const std::string& rel) {
  std::string cur = dir;
  auto parts = fs::path(rel).parent_path();
  for (auto const& part : parts) {
    cur += '/';
    cur += part.string();
    struct stat st {};
    if (lstat(cur.c_str(), &st) == 0) {
      if (S_ISLNK(st.st_mode)) return PermissionDeniedError(fmt::format("refusing to restore through symlink {}", cur));
      if (!S_ISDIR(st.st_mode)) return FailedPreconditionError(fmt::format("{} is not a directory", cur));
      continue;
    }
    if (mkdir(cur.c_str(), 0755) != 0 && errno != EEXIST) return ErrnoToStatus(errno, "creating " + cur);
  }
  return OkStatus();
}

}  // namespace

bool IsSafeRelativePath(const std::string& path) {
  if (path.empty() || path.front() == '/' || path.find('\0') != std::string::npos) return false;
  std::size_t start = 0;
  while (start <= path.size()) {
    auto end = path.find('/', start);
    auto seg = path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (seg.empty() || seg == "." || seg == "..") return false;
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return true;
}

SyncEngine::SyncEngine(std::unique_ptr<ObjectStore> store, SyncOptions options, const Clock& clock)
    : store_(std::move(store)), o_(std::move(options)), clock_(clock) {}

StatusOr<RestoreStats> SyncEngine::Restore() {
  std::lock_guard lk(mu_);
  auto start = clock_.Now();
  RestoreStats stats;
  if (auto s = store_->CheckAccess(); !s.ok()) return s;
  auto done = store_->ReadBytes(kDone);
  if (done.ok()) {
    stats.done = true;
    stats.done_marker = Json::parse(*done, nullptr, false);
    return stats;
  }
  if (done.status().code() != StatusCode::kNotFound) return done.status();

  ObjectInfo manifest_info;
  auto text = store_->ReadBytes(kManifest, &manifest_info);
  if (!text.ok()) {
    if (text.status().code() != StatusCode::kNotFound) return text.status();
    restored_ = true;  // nothing to restore: a fresh run
    manifest_generation_ = 0;
    stats.seconds = Since(start, clock_);
    return stats;
  }
  auto m = Json::parse(*text, nullptr, false);
  if (!m.is_object() || !m.contains("files") || !m["files"].is_array()) {
    return FailedPreconditionError(fmt::format("{}/{} is not a spotvisor manifest", store_->Describe(), kManifest));
  }
  struct Entry {
    std::string path, object;
    std::uint64_t size;
    std::uint32_t crc;
    std::int64_t generation;
  };
  std::vector<Entry> entries;
  for (auto const& f : m["files"]) {
    Entry e{f.value("path", ""), f.value("object", ""), f.value("size", std::uint64_t{0}), 0, f.value("generation", std::int64_t{0})};
    if (!IsSafeRelativePath(e.path) || e.path.find(kRestoreTmp) != std::string::npos) {
      return PermissionDeniedError(fmt::format("manifest names \"{}\", which would escape {}: refusing to restore", e.path, o_.checkpoint_dir));
    }
    auto crc = Crc32cFromBase64(f.value("crc32c", ""));
    if (!crc.ok() || e.object.rfind(kObjectsDir, 0) != 0) {
      return FailedPreconditionError(fmt::format("manifest entry for \"{}\" is malformed", e.path));
    }
    e.crc = *crc;
    entries.push_back(std::move(e));
  }

  std::mutex stats_mu;
  std::map<std::string, Uploaded> restored;
  auto s = ParallelFor(entries.size(), o_.parallelism, [&](std::size_t i) -> Status {
    auto const& e = entries[i];
    auto target = o_.checkpoint_dir + "/" + e.path;
    if (auto p = MakeParentsNoSymlinks(o_.checkpoint_dir, e.path); !p.ok()) return p;
    struct stat st {};
    bool have = lstat(target.c_str(), &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) == e.size;
    if (have) {
      auto crc = FileCrc32c(target);
      have = crc.ok() && *crc == e.crc;
    }
    if (!have) {
      auto tmp = fmt::format("{}{}{}", target, kRestoreTmp, getpid());
      auto got = store_->DownloadToFile(e.object, tmp);
      if (!got.ok()) {
        unlink(tmp.c_str());
        return Status(got.status().code(), fmt::format("restoring {}: {}", e.path, got.status().message()));
      }
      if (got->size != e.size || got->crc32c != e.crc) {
        unlink(tmp.c_str());
        return FailedPreconditionError(fmt::format("restoring {}: object {} does not match the manifest (size {} vs {}, crc32c {} vs {})",
                                                   e.path, e.object, got->size, e.size, Crc32cToBase64(got->crc32c), Crc32cToBase64(e.crc)));
      }
      // rename replaces a symlink at the target instead of following it.
      if (rename(tmp.c_str(), target.c_str()) != 0) {
        int err = errno;
        unlink(tmp.c_str());
        return ErrnoToStatus(err, "renaming into " + target);
      }
      std::lock_guard slk(stats_mu);
      ++stats.files_downloaded;
      stats.bytes_downloaded += e.size;
    }
    if (lstat(target.c_str(), &st) != 0) return ErrnoToStatus(errno, target);
    std::lock_guard slk(stats_mu);
    restored[e.path] = Uploaded{e.size, MtimeNs(st), e.crc, e.object, e.generation};
    return OkStatus();
  });
  if (!s.ok()) return s;
  state_ = std::move(restored);
  restored_ = true;
  manifest_generation_ = manifest_info.generation;
  sequence_ = m.value("sequence", std::int64_t{0});
  stats.resumed = true;
  stats.files = static_cast<int>(entries.size());
  stats.sequence = sequence_;
  stats.seconds = Since(start, clock_);
  return stats;
}

StatusOr<SyncStats> SyncEngine::Sync(bool final) {
  std::lock_guard lk(mu_);
  if (!restored_) {
    return FailedPreconditionError("not syncing: the checkpoint was never restored, so the bucket may hold a newer one");
  }
  auto start = clock_.Now();
  SyncStats stats;
  std::int64_t seq = sequence_ + 1;
  auto now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(clock_.WallNow().time_since_epoch()).count();

  struct Work {
    std::string path;
    struct stat st;
  };
  std::vector<Work> changed;
  std::map<std::string, Uploaded> next;
  std::error_code ec;
  std::string root = o_.checkpoint_dir;
  while (root.size() > 1 && root.back() == '/') root.pop_back();
  for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    struct stat st {};
    if (lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;  // symlinks are not followed
    // A plain prefix cut: fs::relative resolves both paths through the file
    // system (8 readlinks per file), which dominated a no-op sync.
    auto full = it->path().string();
    auto rel = full.substr(std::min(full.size(), root.size() + 1));
    if (rel.find(kRestoreTmp) != std::string::npos) continue;
    auto prev = state_.find(rel);
    if (prev != state_.end() && prev->second.size == static_cast<std::uint64_t>(st.st_size) && prev->second.mtime_ns == MtimeNs(st)) {
      next[rel] = prev->second;
      continue;
    }
    if (!final && now_ns - MtimeNs(st) < std::chrono::duration_cast<std::chrono::nanoseconds>(o_.settle).count()) {
      ++stats.files_deferred;
      if (prev != state_.end()) next[rel] = prev->second;  // keep the last good version
      continue;
    }
    changed.push_back(Work{rel, st});
  }
  if (ec) return ErrnoToStatus(ec.value(), "reading " + o_.checkpoint_dir);

  std::mutex next_mu;
  auto s = ParallelFor(changed.size(), o_.parallelism, [&](std::size_t i) -> Status {
    auto const& w = changed[i];
    auto path = o_.checkpoint_dir + "/" + w.path;
    auto object = fmt::format("{}{}~{}", kObjectsDir, w.path, seq);
    struct stat before = w.st;
    // A file rewritten while it was being uploaded is sent again.
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto up = store_->UploadFile(object, path, {});
      if (!up.ok()) return Status(up.status().code(), fmt::format("uploading {}: {}", w.path, up.status().message()));
      struct stat after {};
      if (lstat(path.c_str(), &after) != 0) {
        if (errno == ENOENT) return OkStatus();  // deleted meanwhile: not part of this checkpoint
        return ErrnoToStatus(errno, path);
      }
      if (after.st_size == static_cast<off_t>(up->size) && MtimeNs(after) == MtimeNs(before)) {
        std::lock_guard nlk(next_mu);
        next[w.path] = Uploaded{up->size, MtimeNs(after), up->crc32c, object, up->generation};
        ++stats.files_uploaded;
        stats.bytes_uploaded += up->size;
        return OkStatus();
      }
      before = after;
    }
    return UnavailableError(fmt::format("{} kept changing while being uploaded", w.path));
  });
  if (!s.ok()) return s;

  // Nothing uploaded and no file gone: the committed manifest already says
  // all there is to say. A no-op sync writes nothing.
  if (stats.files_uploaded == 0 && next.size() == state_.size()) {
    stats.files_total = static_cast<int>(state_.size());
    stats.sequence = sequence_;
    stats.seconds = Since(start, clock_);
    return stats;
  }

  Json files = Json::array();
  for (auto const& [path, u] : next) {
    files.push_back({{"path", path}, {"object", u.object}, {"size", u.size}, {"crc32c", Crc32cToBase64(u.crc32c)},
                     {"generation", u.generation}});
  }
  Json manifest = {{"version", 1},           {"run_id", o_.run_id}, {"sequence", seq},
                   {"instance", o_.instance}, {"committed_at", FormatRfc3339(clock_.WallNow())}, {"files", files}};
  auto committed = store_->UploadBytes(kManifest, manifest.dump(1), Precondition{manifest_generation_});
  if (!committed.ok()) {
    if (committed.status().code() == StatusCode::kFailedPrecondition) {
      return FailedPreconditionError(fmt::format(
          "{}/{} changed since this VM restored it: another VM is using run-id \"{}\"; not overwriting its checkpoint",
          store_->Describe(), kManifest, o_.run_id));
    }
    return committed.status();
  }
  manifest_generation_ = committed->generation;
  sequence_ = seq;
  state_ = std::move(next);

  // Garbage: objects no manifest names any more (older versions, uploads of
  // syncs that never committed). Failure here costs storage, not safety.
  std::map<std::string, bool> live;
  for (auto const& [p, u] : state_) live[u.object] = true;
  auto listed = store_->List(kObjectsDir);
  if (listed.ok()) {
    for (auto const& o : *listed) {
      if (live.count(o.name)) continue;
      if (store_->Delete(o.name, Precondition{o.generation}).ok()) ++stats.files_deleted;
    }
  }
  stats.files_total = static_cast<int>(state_.size());
  stats.sequence = seq;
  stats.seconds = Since(start, clock_);
  return stats;
}

Status SyncEngine::WriteDone(int exit_code) {
  Json done = {{"exit_code", exit_code}, {"time", FormatRfc3339(clock_.WallNow())}, {"instance", o_.instance},
               {"run_id", o_.run_id}, {"sequence", sequence_}};
  auto r = store_->UploadBytes(kDone, done.dump() + "\n", {});
  return r.ok() ? OkStatus() : r.status();
}

}  // namespace spotvisor
