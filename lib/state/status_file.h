// STATE_DIR/status.json: the daemon's current state for `spotvisor status`,
// replaced atomically (write a temporary file, fsync, rename) so a reader
// never sees half of it.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace spotvisor {

Status WriteFileAtomically(const std::string& path, const std::string& contents);
Status WriteStatusFile(const std::string& state_dir, const nlohmann::json& status);
StatusOr<nlohmann::json> ReadStatusFile(const std::string& state_dir);
std::string StatusFilePath(const std::string& state_dir);

}  // namespace spotvisor
