#pragma once

#include <string>

namespace spotvisor {

// `spotvisor status`: what the running (or last) daemon wrote to
// STATE_DIR/status.json, readable or as JSON. Exit 0 while it runs, 3 when
// it is not running (as `systemctl status` does), 4 when there is no status.
int PrintStatus(const std::string& state_dir, bool json);

}  // namespace spotvisor
