#include "config/keys.h"

namespace spotvisor {

const std::vector<KeySpec>& AllKeys() {
  static const std::vector<KeySpec> keys = {
      {"command", KeyType::kCommand, "",
       "The trainer: shell form (run by /bin/sh -c) or a JSON array for exec form"},
      {"user", KeyType::kUser, "",
       "Run the trainer as this user, with its groups and HOME (default: the user spotvisor runs as)"},
      {"workdir", KeyType::kPath, "", "The trainer's working directory, created if missing (default: the user's home)"},
      {"env", KeyType::kEnvList, "", "Extra environment, one NAME=value per line"},
      {"checkpoint-dir", KeyType::kPath, "/var/lib/spotvisor/checkpoints",
       "Where the trainer writes checkpoints (created); passed as SPOTVISOR_CHECKPOINT_DIR"},
      {"run-id", KeyType::kString, "", "Names this run in logs and storage (default: the instance name)"},
      {"state-dir", KeyType::kPath, "/run/spotvisor", "Where status.json is kept for `spotvisor status`"},
      {"stop-timeout", KeyType::kDuration, "20s", "SIGINT -> SIGTERM escalation delay"},
      {"kill-timeout", KeyType::kDuration, "5s", "SIGTERM -> SIGKILL escalation delay"},
      {"on-exit", KeyType::kOnExit, "",
       "What to do after the run: poweroff | none (default: poweroff for `daemon`, none for `run`)"},
      {"shutdown-command", KeyType::kString, "systemctl poweroff", "How on-exit=poweroff powers off (run by /bin/sh -c)"},
      {"log-format", KeyType::kString, "auto",
       "auto (text on a terminal, else JSON lines) | json | text"},
      {"progress-interval", KeyType::kDuration, "5s",
       "Log a \\r-rewritten progress line at most this often"},
      {"metadata-watch-timeout", KeyType::kDuration, "60s",
       "timeout_sec of each metadata long-poll; the HTTP timeout adds a margin of up to 10s"},
  };
  return keys;
}

const KeySpec* FindKey(const std::string& name) {
  for (auto const& k : AllKeys()) {
    if (k.name == name) return &k;
  }
  return nullptr;
}

std::vector<std::string> AllKeyNames() {
  std::vector<std::string> names;
  for (auto const& k : AllKeys()) names.push_back(k.name);
  return names;
}

}  // namespace spotvisor
