// STATE_DIR/status.json: the daemon's current state for `spotvisor status`,
// replaced atomically (write a temporary file, rename) so a reader never
// sees half of it. Not fsync'ed: it lives on tmpfs (/run) and describes a
// running process, and an fsync here once delayed the SIGINT to the trainer.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace spotvisor {

// Readers see the old or the new contents, never a mix. `durable` adds an
// fsync, for data that must survive a power cut (not needed for status).
Status WriteFileAtomically(const std::string& path, const std::string& contents, bool durable = true);
Status WriteStatusFile(const std::string& state_dir, const nlohmann::json& status);
// The file as written by WriteStatusFile: a JSON object whose known fields
// have the types the supervisor writes (checked, so that readers may use
// nlohmann's value() and get<>(), which throw on a wrong type). Anything else
// is kFailedPrecondition naming the file and the field.
StatusOr<nlohmann::json> ReadStatusFile(const std::string& state_dir);
// The same checks on text / a parsed value; `where` names it in errors.
StatusOr<nlohmann::json> ParseStatusJson(std::string_view text, const std::string& where);
Status ValidateStatusJson(const nlohmann::json& j, const std::string& where);
std::string StatusFilePath(const std::string& state_dir);

}  // namespace spotvisor
