// Checkpoints that survive preemption. Objects live under PREFIX/RUN_ID/:
//
//   checkpoints/PATH~SEQ.NONCE  one object per file version; SEQ is the sync
//                               that uploaded it and NONCE is drawn afresh for
//                               every sync, so no upload can ever write an
//                               object that a committed manifest may name
//                               (not a retry after a lost answer, not another
//                               VM on the same run-id)
//   manifest.json               written last, with ifGenerationMatch: the
//                               commit. It carries a commit_id so that a
//                               retried commit whose first answer was lost
//                               recognises itself
//   DONE                        the trainer finished and the final sync
//                               succeeded
//
// Every save in a commit is a state its writer left whole: what may be
// committed is decided by sync/completeness.h (framework saves by their
// evidence, the other files by the marker, sync-settle or as a one-file
// saver; a save that is not whole keeps its committed version), and every
// file is checked again after the upload (or after a local copy): if any file
// changed, vanished or was renamed meanwhile, that snapshot is not committed
// and a new one is taken.
//
// What this VM last committed or restored is remembered in a state file, so
// that after a restart on the same disk the newer local files are kept (and
// synced) instead of being rolled back to the bucket's older commit.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/cancel.h"
#include "common/clock.h"
#include "common/status.h"
#include "retry/sleeper.h"
#include "storage/object_store.h"
#include "sync/completeness.h"
#include "sync/file_facts.h"
#include "sync/manifest.h"

namespace spotvisor {

// What the trainer is doing while a sync runs.
enum class SyncKind {
  kPeriodic,   // running: the tree is committed only at a moment it is complete
  kStopped,    // exited on its own with a non-zero code (failed, before a restart):
               // taken as it is, unless the marker shows its last save was cut off
  kKilled,     // died of a signal (or a shell's 128+N for SIGINT, SIGTERM, SIGKILL...):
               // only the saves it can show are whole (sync/completeness.h)
  kCompleted,  // exited 0: taken as it is
};

struct SyncOptions {
  std::string checkpoint_dir;
  std::string run_id;
  std::string instance;
  int parallelism = 4;
  // Files at once when the context is urgent (the final sync inside a Spot
  // window); 0: the same as parallelism.
  int urgent_parallelism = 0;
  // How often a sync or restore that is still moving bytes reports its
  // progress (0: never).
  std::chrono::milliseconds progress_interval{5000};
  // The tree counts as complete once no file in it changed for this long
  // (unless the completion marker says so sooner).
  std::chrono::milliseconds settle{5000};
  // Where this VM remembers what it last committed or restored (in
  // state-dir); empty: nowhere, so a restart always restores the bucket.
  std::string state_file;
  // The trainer's user (spotvisor running as root, `user` set): restored
  // files and directories are given to it.
  std::optional<uid_t> owner_uid;
  std::optional<gid_t> owner_gid;
  // Waits between snapshot attempts and before DONE's second collection;
  // null: real waits through the context.
  Sleeper* sleeper = nullptr;
  // Periodic syncs deferred in a row before the one warning that the
  // trainer saves faster than sync-settle.
  int warn_after_deferrals = 3;
  // Tests only switch this off to prove the open-for-writing check matters.
  bool check_open_files = true;
  // Free bytes on the file system holding `dir` (null: statvfs; nullopt:
  // cannot tell). Decides whether a staged copy leaves the trainer room.
  std::function<std::optional<std::uint64_t>(const std::string& dir)> free_bytes;
  // A gang (gang-checkpoint = leader): every member starts from the
  // bucket's commit, whatever this disk holds that is newer. Ranks that
  // resumed from different saves would disagree; changed local files are
  // set aside (kSetAsideDir), not lost.
  bool bucket_wins = false;
  // gang-checkpoint = all: manifests under this prefix of the store (a
  // rank's shares of gang checkpoint sets, sync/checkpoint_set.h) name
  // objects that garbage collection must keep. Empty: none.
  std::string pinned_prefix;
  // DONE is written only if there is none yet (several ranks may see the
  // gang complete; the first one writes it).
  bool done_once = false;
  // After DONE, when an upload of this process was abandoned (its answer
  // never came, so the store may apply it late): wait this long and collect
  // once more. Bounded by the context's deadline.
  std::chrono::milliseconds late_collection{2000};
  // STATE_DIR/committed.json: what the bucket holds, for the trainer to read
  // (SPOTVISOR_COMMITTED_FILE); rewritten after every commit and restore.
  // Empty: not written.
  std::string committed_file;
};

// What the bucket holds for this run, as far as this VM knows (its last
// commit or restore). A copy: safe to take while a sync runs.
struct CommittedView {
  std::int64_t sequence = 0;    // 0: nothing committed yet
  std::string committed_at;     // RFC 3339, as the manifest says (the committing VM's clock)
  std::optional<WallTime> committed_time;  // parsed; nullopt if the manifest's text was not a time
  std::string instance;         // the VM that committed it
  int files = 0;
  std::uint64_t bytes = 0;
  // Whether a restore or commit has happened yet (before that, nothing is known).
  bool known = false;
};

// Local files the bucket does not hold as they are now.
struct UncommittedView {
  int files = 0;            // new, changed or removed since the last commit
  std::uint64_t bytes = 0;  // the size now of the new and changed ones
};

// A long transfer as it goes: reported at most every
// SyncOptions::progress_interval while a sync uploads or a restore (or pull)
// downloads, from a worker thread.
struct SyncProgress {
  std::string op;                // "sync" or "restore"
  std::uint64_t bytes_done = 0;  // confirmed by the store so far
  std::uint64_t bytes_total = 0;
  int files_total = 0;
  double elapsed_s = 0;
  // From the rate so far; nullopt until something moved.
  std::optional<double> Rate() const;                // bytes a second
  std::optional<double> SecondsLeft() const;
};

struct SyncStats {
  int files_total = 0;     // in the committed manifest
  int files_uploaded = 0;  // changed since the last sync
  int files_deferred = 0;  // in a tree still being written (not committed)
  int files_deleted = 0;   // objects no longer named by any manifest
  std::uint64_t bytes_uploaded = 0;
  std::int64_t sequence = 0;
  double seconds = 0;
  int attempts = 0;        // snapshots taken (more than one: the tree changed under an upload)
  bool deferred = false;   // nothing committed: the tree was still being written
  bool staged = false;     // the committed snapshot was copied locally first
  // Set when a staged copy was wanted but not made because it would leave
  // the trainer too little room for its next save: why, with the numbers.
  std::string not_staged;
  // Why the tree counted as complete (sync/completeness.h): "marker",
  // "settle", "one-file", "saves", "exited" (the trainer has exited: nothing writes any more); "unchanged" when nothing changed.
  std::string judged_by;
  // Saves that were not whole and kept their committed version (or stayed
  // out): one line each, for the one event that says so.
  std::vector<std::string> left_out;
  std::string deferred_reason;
  // Set once, the first time periodic syncs keep finding the tree mid-save:
  // the text tells the user what to change.
  std::string settle_warning;
  // Names the store cannot hold, first seen in this sync (escaped).
  std::vector<std::string> skipped_names;
  // Could not remember the commit in state-dir (the sync itself succeeded).
  std::string state_warning;
  // The final sync ran out of time or was cancelled: what did not make it.
  std::vector<std::string> not_uploaded;
  // What the bucket does not hold yet, as of this sync's own scan, when it
  // ended on one (nothing to commit, or a tree still being written): the
  // caller need not scan the tree again for it.
  std::optional<UncommittedView> uncommitted;
};

struct RestoreStats {
  bool done = false;        // a DONE marker exists: do not train again
  nlohmann::json done_marker;
  int garbage_deleted = 0;  // with done: objects the final manifest does not name, deleted now
  bool resumed = false;     // a manifest was found and restored (or kept locally)
  bool kept_local = false;  // the local files are newer than the bucket's commit: kept
  int local_changes = 0;    // with kept_local: files changed since that commit
  std::string bucket_won;   // why the bucket's commit replaced local files that had a record
  int set_aside = 0;        // with bucket_won: local files moved to set_aside_dir
  std::string set_aside_dir;  // CHECKPOINT_DIR/.spotvisor-unverified/TIME-PID: this restore's own folder
  // Temporary files of a restore that was killed (FILE.spotvisor-restore.PID),
  // removed before this one: they held the disk's room.
  int stale_temps_removed = 0;
  std::uint64_t stale_temp_bytes = 0;
  // Local copies of files the commit replaces, deleted before their download
  // because the disk had no room for both (the restore had decided: the
  // bucket's commit is what the trainer starts from).
  int stale_dropped = 0;
  std::uint64_t stale_dropped_bytes = 0;
  // `spotvisor pull`: files an earlier pull put here, unedited, that this
  // commit no longer holds or holds in another version: removed.
  int pull_removed = 0;
  int files = 0;
  int files_downloaded = 0;  // the rest were already there, byte-identical
  std::uint64_t bytes_downloaded = 0;
  std::int64_t sequence = 0;
  double seconds = 0;
  std::string state_warning;
};

class SyncEngine {
 public:
  // `store` is rooted at PREFIX/RUN_ID.
  SyncEngine(std::unique_ptr<ObjectStore> store, SyncOptions options, const Clock& clock);

  // Before the trainer starts. An error means the trainer must NOT start
  // from scratch: its first sync would replace a newer checkpoint.
  StatusOr<RestoreStats> Restore(const CallContext& ctx = Background());
  // Thread-safe against itself (one at a time).
  StatusOr<SyncStats> Sync(SyncKind kind, const CallContext& ctx = Background());
  // final: kCompleted, else kPeriodic.
  StatusOr<SyncStats> Sync(bool final, const CallContext& ctx = Background());
  // `already`: with done_once, set when another writer's DONE was there first.
  Status WriteDone(int exit_code, const CallContext& ctx = Background(), bool* already = nullptr);
  std::string Describe() const { return store_->Describe(); }
  // Another VM committed to this run-id: this one no longer syncs. The
  // message says what happened and what to do; empty while not fenced.
  std::string Fenced() const;
  // The supervisor says the trainer is about to start (true) or has been
  // reaped (false); remembered in state_file, so a restart knows whether
  // local files may hold a save cut off by spotvisor's death. Thread-safe,
  // never waits for a sync; returns a warning, or "" once remembered.
  std::string NoteTrainerRunning(bool running);
  // Looks for files in the checkpoint dir held open for appending (logs)
  // and remembers them for this boot: a log is never part of a save, and
  // once the trainer is gone nothing shows it was one. The periodic syncs do
  // this too; the supervisor calls it before it stops the trainer.
  // Thread-safe; never waits for a sync.
  void RememberLogs();
  // `spotvisor pull`: the newest commit into checkpoint_dir (created), and
  // nothing else: no DONE handling, no garbage collection, no state file, no
  // write to the store. `sequence`: that commit or an error saying it is not
  // kept. Files already there with the right size and crc32c are kept, so an
  // interrupted pull goes on where it stopped. The directory ends up holding
  // exactly the commit: files an earlier pull put there (its record,
  // CHECKPOINT_DIR/.spotvisor-pull.json) that are unedited and not this
  // commit's are removed; anything else that is not the commit's is moved to
  // CHECKPOINT_DIR/.spotvisor-replaced/TIME-PID/.
  StatusOr<RestoreStats> Pull(std::optional<std::int64_t> sequence, const CallContext& ctx = Background());
  // Writes the run's status.json (kRunStatus); not once fenced off.
  Status PublishRunStatus(const nlohmann::json& status, const CallContext& ctx = Background());
  // Who hears of SyncProgress (null: nobody). Set before the first sync or
  // restore; called from the worker running it, must not block.
  void SetProgressHandler(std::function<void(const SyncProgress&)> handler) { progress_handler_ = std::move(handler); }
  // Thread-safe; never waits for a sync.
  CommittedView Committed() const;
  // Scans CHECKPOINT_DIR (lstat only) against the last commit. Thread-safe;
  // never waits for a sync.
  StatusOr<UncommittedView> Uncommitted() const;

 private:
  struct Uploaded {
    std::uint64_t size = 0;
    std::int64_t mtime_ns = 0;
    std::uint32_t crc32c = 0;
    std::string object;
    std::int64_t generation = 0;
  };
  using FileMap = std::map<std::string, Uploaded>;

  Status Commit(std::int64_t seq, const FileMap& next, bool marker, const CallContext& ctx);
  void CollectGarbage(std::int64_t seq, const CallContext& ctx, SyncStats& stats);
  // After DONE: every object the final manifest (read back from the store)
  // does not name is garbage. Run by a boot that finds DONE (mu_ held), so
  // uploads that landed after the finishing VM's collection do not stay.
  int CollectAfterDone(const CallContext& ctx);
  // The injected sleeper (tests), else a real wait cut short by `ctx`.
  bool Wait(std::chrono::milliseconds d, const CallContext& ctx) const;
  struct Pending;
  // Writes state_file; `pending`: a commit about to be made (written ahead).
  std::string RememberCommit(bool marker, const Pending* pending = nullptr);
  // Writes `j` (plus trainer_running) to state_file; record_mu_ held.
  std::string WriteRecord(nlohmann::json j);
  // state_ is what the bucket holds now (mu_ held): updates Committed() and
  // committed_file. Returns a warning, or "".
  std::string Publish(const std::string& committed_at, const std::string& instance);
  // `drop_stale`: on a full disk, delete the local files the commit replaces
  // (they are stale: Restore has decided) and try once more; a pull keeps them.
  Status DownloadCommit(const Manifest& m, FileMap& restored, RestoreStats& stats, const CallContext& ctx,
                        bool drop_stale = false);
  std::string InTheWay(const Manifest& m) const;
  // After a restore: each directory of the commit gets the time of its newest file.
  void RestoreDirectoryTimes(const Manifest& m) const;

  std::unique_ptr<ObjectStore> store_;
  SyncOptions o_;
  const Clock& clock_;
  std::function<void(const SyncProgress&)> progress_handler_;
  std::mutex mu_;
  FileMap state_;  // path relative to checkpoint_dir -> what the committed manifest holds
  bool restored_ = false;
  bool marker_committed_ = false;         // the last commit says the trainer uses the marker
  std::int64_t manifest_generation_ = 0;  // 0: no manifest (commit only if none appeared)
  std::int64_t sequence_ = 0;
  std::string commit_id_;                 // of the last commit this VM made or restored
  // A commit whose answer never came (out of time, cancelled): it may have
  // landed. The next commit recognises it by its id.
  struct Pending {
    std::string commit_id;
    std::int64_t sequence = 0;
    FileMap files;
    bool marker = false;
  };
  std::optional<Pending> pending_;
  // Uploads whose answer never came (cancelled, timed out, reset): the
  // store may still apply them later, under a name no manifest holds.
  std::atomic<int> abandoned_uploads_{0};
  mutable std::mutex fence_mu_;
  std::string fenced_;
  std::set<std::string> warned_names_;
  // The one-file saver's memory across scans: the tree's only file, the
  // version last seen, and how many versions were seen in a row.
  std::string one_file_rel_;
  std::tuple<std::uint64_t, std::int64_t, std::uint64_t> one_file_id_{};
  int one_file_versions_ = 0;
  // Files seen held open for appending in this boot: logs (RememberLogs).
  mutable std::mutex logs_mu_;
  std::set<std::string> logs_;
  // When the trainer was last reaped (wall clock, ns; 0: not yet).
  std::atomic<std::int64_t> trainer_ended_ns_{0};
  std::string SettleWarning(const completeness::Verdict& v, bool uses_marker) const;
  int deferrals_ = 0;
  // The most bytes seen changed since a commit: the trainer's largest save
  // so far. A staged copy must leave room for another one beside it.
  std::uint64_t largest_save_ = 0;
  // "" when the checkpoint disk keeps room for that save and a quarter more
  // after `more` bytes are written; else why not, for SyncStats::not_staged.
  std::string StagingRoom(const std::string& root, std::uint64_t more) const;
  bool settle_warned_ = false;
  // The state file's last contents and whether the trainer is running: a
  // restore after spotvisor died with the trainer running cannot trust local
  // files changed since the last commit (the trainer may have been cut off
  // mid-save) unless the marker vouches for them.
  std::mutex record_mu_;
  nlohmann::json record_;
  bool trainer_running_ = false;
  // Committed(): what Publish last saw, and each file's size and mtime.
  mutable std::mutex view_mu_;
  CommittedView view_;
  std::map<std::string, std::pair<std::uint64_t, std::int64_t>> view_files_;
  std::string publish_warning_;  // from the last commit's Publish (mu_ held)
};

// Why the object store cannot hold this relative path (not UTF-8, CR or LF,
// too long), or "" when it can.
std::string UnstorableReason(const std::string& rel);

// Touches DIR/.spotvisor-complete (what `spotvisor checkpoint --done` does).
Status MarkCheckpointComplete(const std::string& checkpoint_dir);

}  // namespace spotvisor
