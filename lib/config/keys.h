// The one list of configuration keys: parsing, `spotvisor config`, the
// did-you-mean for typos and docs/configuration.md all follow it.
#pragma once

#include <string>
#include <vector>

namespace spotvisor {

struct KeySpec {
  std::string name;
  // Default as text. Keys whose default depends on the machine or the mode
  // (user, run-id, on-exit) are filled in by LoadConfig and say so here.
  std::string default_value;
  std::string help;
  // A secret (a password): `spotvisor config` shows whether it is set, never the value.
  bool secret = false;
};

const std::vector<KeySpec>& AllKeys();
const KeySpec* FindKey(const std::string& name);
std::vector<std::string> AllKeyNames();

// Custom metadata attributes carry this prefix: spotvisor-stop-timeout.
inline constexpr char kMetadataPrefix[] = "spotvisor-";

}  // namespace spotvisor
