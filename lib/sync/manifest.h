// The manifest: what a commit names, parsed from bytes that can be anything
// (every field checked; errors are values, never a throw). Also the state
// file in state-dir, which has the same "files".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "storage/object_store.h"

namespace spotvisor {

inline constexpr char kObjectsDir[] = "checkpoints/";
inline constexpr char kManifestObject[] = "manifest.json";
inline constexpr char kDoneObject[] = "DONE";
// What the run's VM says about it, for `spotvisor runs`: running since when,
// or how it ended. Informational: written without a precondition (a VM that
// another VM fenced off does not write it), never read by a restore.
inline constexpr char kRunStatus[] = "status.json";
inline constexpr char kRestoreTmp[] = ".spotvisor-restore.";
// The completion marker: a trainer touches CHECKPOINT_DIR/.spotvisor-complete
// after it has written a whole checkpoint (`spotvisor checkpoint --done` does
// the same). While it is newer than every file the tree is complete; a file
// newer than it means a save is under way.
inline constexpr char kCompleteMarker[] = ".spotvisor-complete";
// Local copies of a snapshot (periodic syncs of trainers that save faster
// than an upload takes), inside the checkpoint dir so a copy stays on its disk.
inline constexpr char kStagingDir[] = ".spotvisor-staging";
// Local files a restore could not trust (changed after the last commit while
// the trainer was running when spotvisor stopped, with no marker to vouch for
// them, or cut off mid-save by the marker's word): moved here, not deleted,
// before the bucket's commit is put back, each restore into a folder of its
// own (.spotvisor-unverified/TIME-PID/). Never synced, never deleted by
// spotvisor: a later restore never destroys what an earlier one set aside.
inline constexpr char kSetAsideDir[] = ".spotvisor-unverified";

struct ManifestEntry {
  std::string path, object;
  std::uint64_t size = 0;
  std::uint32_t crc = 0;
  std::int64_t generation = 0;
  std::int64_t mtime_ns = 0;  // the file's time when committed (0: a manifest from before times were kept)
};

struct Manifest {
  std::vector<ManifestEntry> files;
  std::int64_t sequence = 0;
  std::string commit_id;  // empty in manifests written before commit ids
  std::string instance, committed_at;
  bool marker = false;
};

// What the bucket shows for an object of a run (GcsOptions::describe):
// manifest.json and DONE are application/json; a checkpoint object
// (checkpoints/PATH~SEQ.NONCE) carries the trainer's path and the sync that
// uploaded it as custom metadata (spotvisor-path, spotvisor-sequence).
ObjectDescription DescribeRunObject(const std::string& name);

// `what` names the source in messages; `checkpoint_dir` is where paths would
// be restored (a path escaping it is kPermissionDenied).
StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& what, const std::string& checkpoint_dir);

// A manifest path is safe to restore: relative, no "." or ".." segments, no
// empty segments, no NUL.
bool IsSafeRelativePath(const std::string& path);

// Checked accessors for JSON from outside.
std::optional<std::string> GetString(const nlohmann::json& j, const char* key);
std::optional<std::int64_t> GetInt(const nlohmann::json& j, const char* key);

}  // namespace spotvisor
