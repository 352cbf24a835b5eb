#pragma once

#include <memory>
#include <string>

#include "storage/object_store.h"

namespace spotvisor {

// bucket = file:///PATH: objects are files under PATH, written atomically
// (temporary file, fsync, rename). The generation is the file's mtime in
// nanoseconds; preconditions are checked under an flock on PATH/.lock, so
// they hold between processes on one machine (not on NFS). For local use,
// tests and the demo; sync-via=mount (issue #3) reuses it on a gcsfuse mount.
std::unique_ptr<ObjectStore> MakeFileObjectStore(const std::string& root);

}  // namespace spotvisor
