// Checkpoints that survive preemption. Objects live under PREFIX/RUN_ID/:
//
//   checkpoints/PATH~SEQ   one object per file version; SEQ is the sync that
//                          uploaded it, so a new version never overwrites an
//                          object an older manifest still points at
//   manifest.json          written last, with ifGenerationMatch: the commit
//   DONE                   the trainer finished and the final sync succeeded
//
// Restore trusts only the manifest, so a sync cut off by a hard power-off
// leaves the previous checkpoint intact and restorable. Objects no manifest
// names are deleted after a commit. A VM only commits over the manifest
// generation it restored (or saw committed itself), so two VMs sharing a
// run-id cannot silently overwrite each other.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "common/status.h"
#include "storage/object_store.h"

namespace spotvisor {

struct SyncOptions {
  std::string checkpoint_dir;
  std::string run_id;
  std::string instance;
  int parallelism = 4;
  // Files modified more recently than this are left for the next periodic
  // sync: the trainer may still be writing them. Not applied to the final
  // sync (the trainer has stopped by then).
  std::chrono::milliseconds settle{5000};
};

struct SyncStats {
  int files_total = 0;     // in the committed manifest
  int files_uploaded = 0;  // changed since the last sync
  int files_deferred = 0;  // too fresh (sync-settle)
  int files_deleted = 0;   // objects no longer named by any manifest
  std::uint64_t bytes_uploaded = 0;
  std::int64_t sequence = 0;
  double seconds = 0;
};

struct RestoreStats {
  bool done = false;        // a DONE marker exists: do not train again
  nlohmann::json done_marker;
  bool resumed = false;     // a manifest was found and restored
  int files = 0;
  int files_downloaded = 0;  // the rest were already there, byte-identical
  std::uint64_t bytes_downloaded = 0;
  std::int64_t sequence = 0;
  double seconds = 0;
};

class SyncEngine {
 public:
  // `store` is rooted at PREFIX/RUN_ID.
  SyncEngine(std::unique_ptr<ObjectStore> store, SyncOptions options, const Clock& clock);

  // Before the trainer starts. An error means the trainer must NOT start
  // from scratch: its first sync would replace a newer checkpoint.
  StatusOr<RestoreStats> Restore();
  // Thread-safe against itself (one at a time).
  StatusOr<SyncStats> Sync(bool final);
  Status WriteDone(int exit_code);
  std::string Describe() const { return store_->Describe(); }

 private:
  struct Uploaded {
    std::uint64_t size = 0;
    std::int64_t mtime_ns = 0;
    std::uint32_t crc32c = 0;
    std::string object;
    std::int64_t generation = 0;
  };

  std::unique_ptr<ObjectStore> store_;
  SyncOptions o_;
  const Clock& clock_;
  std::mutex mu_;
  std::map<std::string, Uploaded> state_;  // path relative to checkpoint_dir
  bool restored_ = false;
  std::int64_t manifest_generation_ = 0;  // 0: no manifest (commit only if none appeared)
  std::int64_t sequence_ = 0;
};

// A manifest path is safe to restore: relative, no "." or ".." segments, no
// empty segments, no NUL.
bool IsSafeRelativePath(const std::string& path);

}  // namespace spotvisor
