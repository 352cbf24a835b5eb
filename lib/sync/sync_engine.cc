#include "sync/sync_engine.h"

#include "sync/engine_internal.h"
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

namespace fs = std::filesystem;
using namespace sync_internal;


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
    // mtime_ns: the time the file had here, put back by a restore.
    files.push_back({{"path", path}, {"object", u.object}, {"size", u.size}, {"crc32c", Crc32cToBase64(u.crc32c)},
                     {"generation", u.generation}, {"mtime_ns", u.mtime_ns}});
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

std::string SyncEngine::StagingRoom(const std::string& root, std::uint64_t more) const {
  std::optional<std::uint64_t> free;
  if (o_.free_bytes) {
    free = o_.free_bytes(root);
  } else if (struct statvfs vfs {}; statvfs(root.c_str(), &vfs) == 0) {
    free = static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  }
  return StagingRoomProblem(free, more, largest_save_);
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
    largest_save_ = std::max(largest_save_, at_risk.bytes);
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
      bool clones = true;  // until a reflink fails: then every copy takes room
      bool room_checked = false;
      std::uint64_t still_to_copy = 0;
      for (auto const* e : changed) still_to_copy += e->st.size;
      for (auto const* e : changed) {
        auto dst = fmt::format("{}/{}", staging_root, e->rel);
        fs::create_directories(fs::path(dst).parent_path(), ec);
        if (ec) {
          copied = ErrnoToStatus(ec.value(), "creating " + Escaped(fs::path(dst).parent_path().string()));
          break;
        }
        bool cloned = false;
        if (clones) {
          cloned = CloneFile(root + "/" + e->rel, dst);
          clones = cloned;
        }
        if (!cloned) {
          // Real copies take room: only with room left, after all of them,
          // for the trainer's next save.
          if (!room_checked) {
            room_checked = true;
            if (auto room = StagingRoom(root, still_to_copy); !room.empty()) {
              copied = FailedPreconditionError(room);
              stats.not_staged = room;
              break;
            }
          }
          copied = CopyFile(root + "/" + e->rel, dst);
        }
        still_to_copy -= std::min<std::uint64_t>(still_to_copy, e->st.size);
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
