// The restore before the trainer starts, and `spotvisor pull`: the commit
// put back into the checkpoint dir, and what a restore decides about the
// local files it finds there (docs/checkpoints.md: restarts on the same
// disk, a full disk while restoring).
#include "sync/sync_engine.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>

#include "common/units.h"
#include "common/parallel_for.h"
#include "common/strings.h"
#include "storage/crc32c.h"
#include "sync/engine_internal.h"
#include "sync/manifest.h"

namespace spotvisor {

namespace fs = std::filesystem;
using namespace sync_internal;

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

namespace {

void SetMtime(const std::string& path, std::int64_t mtime_ns) {
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1].tv_sec = static_cast<time_t>(mtime_ns / 1'000'000'000);
  times[1].tv_nsec = static_cast<long>(mtime_ns % 1'000'000'000);
  utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW);  // best effort: a time is not worth failing a restore
}

// Each directory the commit's files are in gets the time of the newest file
// under it, deepest first, as if its files had just been written into it:
// what `save_total_limit` (by directory mtime) and a person's `ls -t` see
// after a restore is the order of the saves, not of the downloads. Only
// from manifests that carry times (1.x manifests before this do not).
void RestoreDirectoryTimesOf(const std::string& root, const Manifest& m) {
  std::map<std::string, std::int64_t> newest;  // relative directory -> newest mtime under it
  for (auto const& e : m.files) {
    if (e.mtime_ns <= 0) return;
    for (auto slash = e.path.rfind('/'); slash != std::string::npos && slash > 0; slash = e.path.rfind('/', slash - 1)) {
      auto& t = newest[e.path.substr(0, slash)];
      t = std::max(t, e.mtime_ns);
    }
  }
  // Longest paths first: setting a child's time does not touch its parent's.
  std::vector<std::pair<std::string, std::int64_t>> dirs(newest.begin(), newest.end());
  std::sort(dirs.begin(), dirs.end(), [](auto const& a, auto const& b) { return a.first.size() > b.first.size(); });
  for (auto const& [dir, t] : dirs) SetMtime(root + "/" + dir, t);
}

}  // namespace

void SyncEngine::RestoreDirectoryTimes(const Manifest& m) const { RestoreDirectoryTimesOf(o_.checkpoint_dir, m); }

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
    std::int64_t generation = e.generation;
    if (!have) {
      auto tmp = fmt::format("{}{}{}", target, kRestoreTmp, getpid());
      auto got = store_->DownloadToFile(e.object, tmp, e.size, ctx);
      if (!got.ok()) {
        unlink(tmp.c_str());
        return Status(got.status().code(), fmt::format("restoring {}: {}", Escaped(e.path), got.status().message()));
      }
      // The object rewritten with the same bytes during the restore is read
      // at its new generation (the store re-pins it): later preconditions name that one.
      if (got->generation != 0) generation = got->generation;
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
    // The time it had when committed: frameworks order saves by it
    // (Lightning's newest last*.ckpt, transformers' rotation since 4.52).
    if (e.mtime_ns > 0) SetMtime(target, e.mtime_ns);
    if (lstat(target.c_str(), &st) != 0) return ErrnoToStatus(errno, Escaped(target));
    std::lock_guard slk(stats_mu);
    restored[e.path] = Uploaded{e.size, Ns(st.st_mtim), e.crc, e.object, generation};
    return OkStatus();
  });
  };
  auto s = attempt();
  if (s.ok()) RestoreDirectoryTimes(*m);
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
                       FormatBytes(static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize), Escaped(o_.checkpoint_dir), FormatBytes(need));
  }
  auto aside = TreeBytes(o_.checkpoint_dir + "/" + kSetAsideDir);
  if (aside > 0) {
    out += fmt::format(" {} in {}/{}, set aside by earlier restores (look at them, then delete what you do not need);",
                       FormatBytes(aside), Escaped(o_.checkpoint_dir), kSetAsideDir);
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
        names += fmt::format("{}\"{}\" {}", i ? ", " : "", Escaped(extra[i].second), FormatBytes(extra[i].first));
      }
      out += fmt::format(" {} local file(s) the commit does not name hold {} (largest: {});", extra.size(), FormatBytes(extra_bytes),
                         names);
    }
  }
  out.pop_back();
  return out + ". The checkpoint-dir's disk must hold the commit: make room or give it a bigger disk";
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

}  // namespace spotvisor
