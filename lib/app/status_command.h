#pragma once

#include <chrono>
#include <string>

namespace spotvisor {

// `spotvisor status`: what the running (or last) daemon wrote to
// STATE_DIR/status.json, readable or as JSON. Exit 0 while it runs, 3 when
// it is not running (as `systemctl status` does), 4 when there is no status.
int PrintStatus(const std::string& state_dir, bool json);

// `spotvisor sync`: asks the running daemon for a checkpoint sync (SIGUSR1)
// and waits up to `timeout` for its result in status.json. Exit 0 when it
// succeeded, 1 when it failed, 3 when spotvisor is not running, 4 without
// status, 5 when no bucket is configured, 6 on timeout.
int RequestSync(const std::string& state_dir, std::chrono::milliseconds timeout);

// `spotvisor release`: ends an on-failure-hold now (SIGUSR2 to the daemon).
// Exit 0 when released, 2 when nothing is held, 3 when not running, 4
// without status.
int RequestRelease(const std::string& state_dir);

}  // namespace spotvisor
