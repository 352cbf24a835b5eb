#include "app/launch_common.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/random.h"
#include "config/keys.h"
#include "output/utf8.h"

namespace spotvisor::launch {

std::string Shown(const std::string& s) { return output::EscapeInvalidUtf8(s.substr(0, 300)); }

int UsageError(const std::string& message) {
  std::fprintf(stderr, "spotvisor launch: %s\n", message.c_str());
  return kExitUsage;
}

std::string RandomUuid() {
  std::uint64_t a = RandomSeed(), b = RandomSeed();
  a = (a & 0xffffffffffff0fffull) | 0x0000000000004000ull;
  b = (b & 0x3fffffffffffffffull) | 0x8000000000000000ull;
  return fmt::format("{:08x}-{:04x}-{:04x}-{:04x}-{:012x}", a >> 32, (a >> 16) & 0xffff, a & 0xffff, b >> 48,
                     b & 0xffffffffffffull);
}

StatusOr<std::vector<std::pair<std::string, std::string>>> RunKeys(const LaunchOptions& o) {
  std::vector<std::pair<std::string, std::string>> keys = {{"run-id", o.run_id}, {"bucket", o.bucket}};
  bool command = false;
  for (auto const& [key, value] : o.sets) {
    if (FindKey(key) == nullptr) {
      return InvalidArgumentError(fmt::format("--set {}: not a spotvisor key (`spotvisor config --template` lists them)", Shown(key)));
    }
    if (key == "run-id" || key == "bucket") return InvalidArgumentError(fmt::format("--set {}: give it as --{}", key, key));
    command = command || key == "command";
    keys.emplace_back(key, value);
  }
  if (!o.command.empty()) {
    if (command) return InvalidArgumentError("the command is given twice (--set command= and after --)");
    using Json = nlohmann::json;
    keys.emplace_back("command", Json(o.command).dump(-1, ' ', false, Json::error_handler_t::replace));  // exec form
    command = true;
  }
  if (!command) return InvalidArgumentError("no command: give the trainer after --, e.g. -- python3 train.py");
  return keys;
}

std::string OtherCloudFlag(const LaunchOptions& o, const std::vector<std::string>& not_here, const char* cloud) {
  for (auto const& flag : o.flags_given) {
    if (std::find(not_here.begin(), not_here.end(), flag) != not_here.end()) {
      return fmt::format("{} is for {}: the bucket {} makes this a launch on {}", flag,
                         std::string_view(cloud) == "GCE" ? "EC2" : "GCE", Shown(o.bucket), cloud);
    }
  }
  return "";
}

}  // namespace spotvisor::launch
