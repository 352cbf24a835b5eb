// The commands a person runs on a laptop (issue #14): `spotvisor runs` lists
// the runs under a bucket prefix, `spotvisor pull` downloads one's newest
// committed checkpoint under the trainer's own file names. Both only read
// the bucket. Credentials: --access-token-command, else Application Default
// Credentials (authorized_user), else the metadata server (on a VM);
// STORAGE_EMULATOR_HOST turns authentication off, as in Google's tools.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace spotvisor {

struct RemoteOptions {
  std::string access_token_command;
  std::string storage_endpoint = "https://storage.googleapis.com";
  // `runs` asks the groups of the runs how they are now (group_state.h).
  std::string compute_endpoint = "https://compute.googleapis.com/compute/v1";
  bool group_state = true;
  int parallelism = 8;
};

// Exit codes: 0 listed; 1 the bucket could not be read; 64 a bad URL.
int ListRuns(const std::string& url, const RemoteOptions& options, bool json);
// Removes old runs' objects under URL (seed 003: outputs pile up unless
// cleaned): runs beyond the `keep` most recent and/or older than
// `older_than` (by their last commit or status time), never one whose VM
// says it is running. Only lists unless `apply`. Exit codes: 0 listed or
// deleted; 1 a failure (the message says which run); 64 usage.
int GcRuns(const std::string& url, std::optional<int> keep, std::optional<std::chrono::milliseconds> older_than,
           bool apply, const RemoteOptions& options);

// URL is gs://BUCKET/PREFIX/RUN_ID (or file:///PATH/RUN_ID); DIR defaults to
// ./RUN_ID. Exit codes: 0 pulled; 1 failed (the message says why; files
// pulled so far stay, and a second pull goes on from them); 64 a bad URL.
int PullRun(const std::string& url, const std::string& dir, std::optional<std::int64_t> sequence,
            const RemoteOptions& options);

// Writes URL/STOP (run/budget.h) so that the run's VMs end it gracefully.
// Exit codes: 0 requested (with `wait`: and ended); 1 failed; 2 `wait` ran
// out; 64 a bad URL.
int StopRun(const std::string& url, std::optional<std::chrono::milliseconds> wait, const RemoteOptions& options);

}  // namespace spotvisor
