#include "app/status_command.h"

#include <sys/types.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>

#include <fmt/format.h>

#include "state/status_file.h"

namespace spotvisor {

int PrintStatus(const std::string& state_dir, bool json) {
  auto st = ReadStatusFile(state_dir);
  if (!st.ok()) {
    std::fprintf(stderr, "spotvisor status: no status in %s (%s); is spotvisor running with this state-dir?\n",
                 state_dir.c_str(), st.status().message().c_str());
    return 4;
  }
  auto const& j = *st;
  int pid = j.value("spotvisor_pid", 0);
  bool running = pid > 0 && j.value("phase", "") != "done" && (kill(pid, 0) == 0 || errno == EPERM);
  if (json) {
    auto out = j;
    out["running"] = running;
    std::puts(out.dump(2).c_str());
    return running ? 0 : 3;
  }
  auto str = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : std::string("-"); };
  std::string trainer = j.contains("trainer_pid") && j["trainer_pid"].is_number() ? std::to_string(j["trainer_pid"].get<int>()) : "-";
  std::printf("run:         %s (%s mode)\n", str("run_id").c_str(), str("mode").c_str());
  std::printf("phase:       %s since %s%s\n", str("phase").c_str(), str("since").c_str(),
              running ? "" : "  (spotvisor is not running: last recorded state)");
  std::printf("spotvisor:   pid %d\n", pid);
  std::printf("trainer:     %s\n", trainer == "-" ? "not running" : ("pid " + trainer).c_str());
  if (j.contains("reason")) std::printf("reason:      %s\n", str("reason").c_str());
  if (j.contains("exit_code")) std::printf("exit code:   %d\n", j["exit_code"].get<int>());
  if (j.contains("last_event")) {
    auto const& e = j["last_event"];
    std::printf("last event:  %s  %s  (%s)\n", e.value("event", "").c_str(), e.value("message", "").c_str(),
                e.value("time", "").c_str());
  }
  return running ? 0 : 3;
}

}  // namespace spotvisor
