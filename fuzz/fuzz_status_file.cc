// status.json as `spotvisor status`, `sync` and `release` read it: once
// ParseStatusJson accepts a file, the readers' value() / get<>() / dump()
// calls (copied from lib/app/status_command.cc) must not throw.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "state/status_file.h"

namespace {

void ReadLikeTheCommands(const nlohmann::json& j) {
  volatile int pid = j.value("spotvisor_pid", 0);
  std::string phase = j.value("phase", "");
  std::string bucket = j.value("bucket", "");
  if (j.contains("trainer_pid") && j["trainer_pid"].is_number()) pid = j["trainer_pid"].get<int>();
  if (j.contains("exit_code")) pid = j["exit_code"].get<int>();
  if (j.contains("last_event")) {
    auto const& e = j["last_event"];
    phase = e.value("event", "") + e.value("message", "") + e.value("time", "");
  }
  if (j.contains("last_sync")) {
    auto const& ls = j["last_sync"];
    if (!ls.is_null()) {
      volatile bool ok = ls.value("ok", false);
      volatile long long n = static_cast<long long>(ls.value("sequence", 0));
      n = ls.value("files_uploaded", 0);
      n = static_cast<long long>(ls.value("bytes", 0));
      phase = ls.value("kind", "") + ls.value("error", "");
      (void)ok;
      (void)n;
    }
    phase = ls.dump();
  }
  if (auto c = j.find("checkpoint"); c != j.end()) {
    // As `spotvisor status` prints the durability block.
    for (const char* k : {"committed_at", "uncommitted_as_of", "caught_up_at", "stall_cause"}) {
      if (auto it = c->find(k); it != c->end() && it->is_string()) phase = it->get<std::string>();
    }
    for (const char* k : {"sequence", "files", "bytes", "uncommitted_files", "uncommitted_bytes"}) {
      auto it = c->find(k);
      volatile unsigned long long n = it != c->end() && it->is_number_unsigned() ? it->get<std::uint64_t>()
                                      : it != c->end() && it->is_number_integer() && it->get<long long>() > 0
                                          ? static_cast<std::uint64_t>(it->get<long long>())
                                          : 0;
      (void)n;
    }
    if (c->contains("stalled") && (*c)["stalled"].is_boolean()) pid = (*c)["stalled"].get<bool>();
  }
  auto out = j;
  out["running"] = false;
  phase = out.dump(2);
  (void)pid;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto j = spotvisor::ParseStatusJson(text, "status.json");
  if (!j.ok()) return 0;
  ReadLikeTheCommands(*j);
  return 0;
}
