#include "app/status_command.h"

#include <sys/types.h>
#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

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
  if (j.contains("deadline")) std::printf("deadline:    %s\n", str("deadline").c_str());
  if (j.contains("reason")) std::printf("reason:      %s\n", str("reason").c_str());
  if (j.contains("exit_code")) std::printf("exit code:   %d\n", j["exit_code"].get<int>());
  if (j.contains("last_event")) {
    auto const& e = j["last_event"];
    std::printf("last event:  %s  %s  (%s)\n", e.value("event", "").c_str(), e.value("message", "").c_str(),
                e.value("time", "").c_str());
  }
  return running ? 0 : 3;
}

int RequestSync(const std::string& state_dir, std::chrono::milliseconds timeout) {
  auto st = ReadStatusFile(state_dir);
  if (!st.ok()) {
    std::fprintf(stderr, "spotvisor sync: no status in %s (%s); is spotvisor running?\n", state_dir.c_str(),
                 st.status().message().c_str());
    return 4;
  }
  int pid = st->value("spotvisor_pid", 0);
  if (pid <= 0 || st->value("phase", "") == "done" || kill(pid, 0) != 0) {
    std::fprintf(stderr, "spotvisor sync: spotvisor is not running (last phase: %s)\n", st->value("phase", "?").c_str());
    return 3;
  }
  if (!st->contains("bucket")) {
    std::fprintf(stderr, "spotvisor sync: no bucket is configured, nothing to sync to\n");
    return 5;
  }
  std::string before = st->contains("last_sync") ? (*st)["last_sync"].dump() : "";
  if (kill(pid, SIGUSR1) != 0) {
    std::fprintf(stderr, "spotvisor sync: cannot signal pid %d: %s\n", pid, std::strerror(errno));
    return 3;
  }
  std::printf("sync requested from spotvisor (pid %d) to %s ...\n", pid, st->value("bucket", "").c_str());
  std::fflush(stdout);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    // Polling a small local file is the simplest channel a CLI has; the
    // daemon rewrites it when the sync ends.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto now = ReadStatusFile(state_dir);
    if (!now.ok() || !now->contains("last_sync")) continue;
    auto const& ls = (*now)["last_sync"];
    if (ls.dump() == before) continue;
    if (ls.value("ok", false)) {
      std::printf("%s sync #%lld done: %d file(s), %lld bytes uploaded\n", ls.value("kind", "").c_str(),
                  static_cast<long long>(ls.value("sequence", 0)), ls.value("files_uploaded", 0),
                  static_cast<long long>(ls.value("bytes", 0)));
      return 0;
    }
    std::fprintf(stderr, "sync failed: %s\n", ls.value("error", "").c_str());
    return 1;
  }
  std::fprintf(stderr, "spotvisor sync: no result within the timeout; see the logs (sync.complete / sync.failed)\n");
  return 6;
}

int RequestRelease(const std::string& state_dir) {
  auto st = ReadStatusFile(state_dir);
  if (!st.ok()) {
    std::fprintf(stderr, "spotvisor release: no status in %s (%s)\n", state_dir.c_str(), st.status().message().c_str());
    return 4;
  }
  int pid = st->value("spotvisor_pid", 0);
  if (pid <= 0 || st->value("phase", "") == "done" || kill(pid, 0) != 0) {
    std::fprintf(stderr, "spotvisor release: spotvisor is not running\n");
    return 3;
  }
  if (st->value("phase", "") != "holding") {
    std::fprintf(stderr, "spotvisor release: nothing to release (phase: %s)\n", st->value("phase", "?").c_str());
    return 2;
  }
  if (kill(pid, SIGUSR2) != 0) {
    std::fprintf(stderr, "spotvisor release: cannot signal pid %d: %s\n", pid, std::strerror(errno));
    return 3;
  }
  std::printf("released: spotvisor (pid %d) goes on to on-exit\n", pid);
  return 0;
}

}  // namespace spotvisor
