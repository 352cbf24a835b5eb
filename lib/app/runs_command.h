// The commands a person runs on a laptop (issue #14): `spotvisor runs` lists
// the runs under a bucket prefix, `spotvisor pull` downloads one's newest
// committed checkpoint under the trainer's own file names. Both only read
// the bucket. Credentials: --access-token-command, else Application Default
// Credentials (authorized_user), else the metadata server (on a VM);
// STORAGE_EMULATOR_HOST turns authentication off, as in Google's tools.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace spotvisor {

struct RemoteOptions {
  std::string access_token_command;
  std::string storage_endpoint = "https://storage.googleapis.com";
  int parallelism = 8;
};

// Exit codes: 0 listed; 1 the bucket could not be read; 64 a bad URL.
int ListRuns(const std::string& url, const RemoteOptions& options, bool json);
// URL is gs://BUCKET/PREFIX/RUN_ID (or file:///PATH/RUN_ID); DIR defaults to
// ./RUN_ID. Exit codes: 0 pulled; 1 failed (the message says why; files
// pulled so far stay, and a second pull goes on from them); 64 a bad URL.
int PullRun(const std::string& url, const std::string& dir, std::optional<std::int64_t> sequence,
            const RemoteOptions& options);

}  // namespace spotvisor
