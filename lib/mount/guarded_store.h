// sync-via = mount: the object store is a directory on the FUSE mount of the
// bucket. If that mount goes away (the driver died, someone unmounted it),
// writes would land in the bare mount point and a sync would "succeed"
// without reaching the bucket. This wrapper checks the mount before every
// operation and fails it instead.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "storage/object_store.h"

namespace spotvisor {

// `check` says whether the mount is there (OkStatus) or why not.
std::unique_ptr<ObjectStore> GuardByMount(std::unique_ptr<ObjectStore> inner, std::function<Status()> check);

// The real check: `dir` is the mount point of a FUSE filesystem now.
Status CheckFuseMounted(const std::string& dir);

}  // namespace spotvisor
