#include "app/status_command.h"

#include <sys/types.h>
#include <signal.h>

#include <cstdint>
#include <cstdio>
#include <thread>

#include <fmt/format.h>

#include "common/duration.h"
#include "log/logger.h"
#include "output/utf8.h"
#include "process/proc.h"
#include "supervisor/durability.h"
#include "state/status_file.h"

namespace spotvisor {
namespace {

// What status.json says about the spotvisor that wrote it. A spotvisor that
// died (SIGKILL, OOM, a crash) leaves its pid behind, and the kernel hands
// pids out again: the pid alone names whatever runs under it now.
RecordedProcess Writer(const nlohmann::json& j) {
  RecordedProcess r;
  r.name = "spotvisor";
  if (auto it = j.find("spotvisor_pid"); it != j.end() && it->is_number_integer()) {
    auto pid = it->get<long long>();
    if (pid > 0 && pid <= INT32_MAX) r.pid = static_cast<pid_t>(pid);
  }
  if (auto it = j.find("start_time_ticks"); it != j.end() && (it->is_number_unsigned() || it->is_number_integer())) {
    if (it->is_number_unsigned() || it->get<long long>() >= 0) r.start_ticks = it->get<std::uint64_t>();
  }
  if (auto it = j.find("boot_id"); it != j.end() && it->is_string()) r.boot_id = it->get<std::string>();
  return r;
}

std::string Phase(const nlohmann::json& j) {
  auto it = j.find("phase");
  return it != j.end() && it->is_string() ? it->get<std::string>() : "?";
}

// Whether the writer still runs, by sending it `signo` (0: only look).
// Returns 0 once signalled, else prints why not on stderr and returns 3.
int SignalDaemon(const char* command, const std::string& state_dir, const nlohmann::json& st, int signo) {
  auto writer = Writer(st);
  if (writer.pid <= 0 || Phase(st) == "done") {
    std::fprintf(stderr, "%s: spotvisor is not running (last phase: %s)\n", command, Phase(st).c_str());
    return 3;
  }
  auto s = SignalRecordedProcess(writer, signo);
  if (s.ok() || (signo == 0 && s.code() == StatusCode::kPermissionDenied)) return 0;
  if (s.code() == StatusCode::kNotFound) {
    std::fprintf(stderr, "%s: spotvisor is not running (pid %d has exited; last phase: %s)\n", command, writer.pid,
                 Phase(st).c_str());
  } else if (s.code() == StatusCode::kFailedPrecondition) {
    std::fprintf(stderr,
                 "%s: spotvisor is not running: %s/status.json names pid %d, but %s; the spotvisor that wrote it "
                 "died (last phase: %s). Nothing was signalled.\n",
                 command, state_dir.c_str(), writer.pid, s.message().c_str(), Phase(st).c_str());
  } else {
    std::fprintf(stderr, "%s: cannot signal spotvisor (pid %d): %s\n", command, writer.pid, s.message().c_str());
  }
  return 3;
}

bool DaemonRunning(const nlohmann::json& st) {
  auto writer = Writer(st);
  if (writer.pid <= 0 || Phase(st) == "done") return false;
  auto s = SignalRecordedProcess(writer, 0);
  return s.ok() || s.code() == StatusCode::kPermissionDenied;
}

}  // namespace

int PrintStatus(const std::string& state_dir, bool json) {
  auto st = ReadStatusFile(state_dir);
  if (!st.ok()) {
    std::fprintf(stderr, "spotvisor status: no status in %s (%s); is spotvisor running with this state-dir?\n",
                 state_dir.c_str(), st.status().message().c_str());
    return 4;
  }
  auto const& j = *st;
  int pid = Writer(j).pid;
  bool running = DaemonRunning(j);
  if (json) {
    auto out = j;
    out["running"] = running;
    std::puts(out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
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
  if (auto c = j.find("checkpoint"); c != j.end()) {
    // Ages are computed now, from the times written: status.json is only
    // rewritten when something happens.
    auto now = std::chrono::system_clock::now();
    auto ago = [&](const char* key) -> std::string {
      auto it = c->find(key);
      if (it == c->end() || !it->is_string()) return "";
      auto t = ParseRfc3339(it->get<std::string>());
      if (!t) return "";
      auto s = std::max<long long>(0, std::chrono::duration_cast<std::chrono::seconds>(now - *t).count());
      return FormatDuration(std::chrono::seconds(s)) + " ago";
    };
    auto num = [&](const char* key) -> std::uint64_t {
      auto it = c->find(key);
      return it != c->end() && it->is_number_unsigned() ? it->get<std::uint64_t>()
             : it != c->end() && it->is_number_integer() && it->get<long long>() > 0 ? static_cast<std::uint64_t>(it->get<long long>())
                                                                                      : 0;
    };
    if (num("sequence") == 0) {
      std::printf("checkpoint:  nothing committed yet\n");
    } else {
      std::string at = c->contains("committed_at") && (*c)["committed_at"].is_string() ? (*c)["committed_at"].get<std::string>() : "?";
      std::string age = ago("committed_at");
      std::printf("checkpoint:  #%llu committed %s%s: %llu file(s), %s\n", static_cast<unsigned long long>(num("sequence")),
                  at.c_str(), age.empty() ? "" : (" (" + age + ")").c_str(), static_cast<unsigned long long>(num("files")),
                  FormatBytes(num("bytes")).c_str());
    }
    if (c->contains("uncommitted_files")) {
      std::string as_of = c->contains("uncommitted_as_of") ? " (counted " + ago("uncommitted_as_of") + ")" : "";
      if (num("uncommitted_files") == 0) {
        std::printf("on disk:     nothing newer than the commit%s\n", as_of.c_str());
      } else {
        std::printf("on disk:     %s in %llu file(s) not committed yet%s\n", FormatBytes(num("uncommitted_bytes")).c_str(),
                    static_cast<unsigned long long>(num("uncommitted_files")), as_of.c_str());
      }
    }
    if (std::string caught = ago("caught_up_at"); !caught.empty()) {
      bool stalled = c->contains("stalled") && (*c)["stalled"].is_boolean() && (*c)["stalled"].get<bool>();
      std::string cause = c->contains("stall_cause") && (*c)["stall_cause"].is_string() ? (*c)["stall_cause"].get<std::string>() : "";
      std::printf("caught up:   %s%s\n", caught.c_str(), stalled ? ("  STALLED: " + cause).c_str() : "");
    }
  }
  if (auto t = j.find("transfer"); t != j.end() && t->is_object()) {
    // Validated by ParseStatusJson: the types are as written.
    auto u64 = [&](const char* k) { return t->contains(k) ? (*t)[k].get<std::uint64_t>() : 0; };
    auto num = [&](const char* k) -> std::optional<double> {
      return t->contains(k) && (*t)[k].is_number() ? std::optional<double>((*t)[k].get<double>()) : std::nullopt;
    };
    std::uint64_t done = u64("bytes_done"), total = u64("bytes_total");
    std::string kind = t->value("kind", "");
    std::printf("transfer:    %s%s: %s of %s (%.0f%%)%s%s (as of %s)\n", kind.c_str(), kind == "restore" ? "" : " sync",
                FormatBytes(done).c_str(), FormatBytes(total).c_str(),
                total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
                num("throughput_mbps") ? (", " + FormatRate(*num("throughput_mbps") * 1e6)).c_str() : "",
                num("eta_s") ? fmt::format(", about {} left", FormatDuration(std::chrono::seconds(
                                                                   static_cast<long long>(*num("eta_s") + 0.5))))
                                   .c_str()
                             : "",
                t->value("as_of", "").c_str());
  }
  if (auto g = j.find("gang"); g != j.end() && g->is_object()) {
    // Names and addresses came from etcd, written by other machines: shown
    // only as printable text.
    auto text = [](const nlohmann::json& o, const char* k) {
      auto it = o.find(k);
      std::string v = it != o.end() && it->is_string() ? it->get<std::string>() : "";
      for (auto& ch : v) {
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
      }
      return v.size() > 128 ? v.substr(0, 128) + "..." : v;
    };
    auto num = [](const nlohmann::json& o, const char* k) -> std::optional<long long> {
      auto it = o.find(k);
      return it != o.end() && it->is_number_integer() ? std::optional<long long>(it->get<long long>()) : std::nullopt;
    };
    auto size = num(*g, "size"), rank = num(*g, "rank"), generation = num(*g, "generation");
    if (rank && generation) {
      std::printf("gang:        %s, rank %lld of %lld, generation %lld\n", text(*g, "name").c_str(), *rank, size.value_or(0),
                  *generation);
    } else {
      std::printf("gang:        %s (%lld members), not formed\n", text(*g, "name").c_str(), size.value_or(0));
    }
    if (auto m = g->find("members"); m != g->end() && m->is_array()) {
      for (auto const& member : *m) {
        if (!member.is_object()) continue;
        auto phase = text(member, "phase");
        std::printf("             rank %lld: %s (%s)%s%s\n", num(member, "rank").value_or(-1), text(member, "instance").c_str(),
                    text(member, "ip").c_str(), phase.empty() ? "" : ", ", phase.c_str());
      }
    }
  }
  if (auto g = j.find("group"); g != j.end() && g->is_string()) {
    std::printf("group:       %s\n", output::EscapeInvalidUtf8(g->get<std::string>().substr(0, 300)).c_str());
  }
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
  int pid = Writer(*st).pid;
  // Checked before the bucket: "not running" is the answer that matters.
  if (int rc = SignalDaemon("spotvisor sync", state_dir, *st, 0); rc != 0) return rc;
  if (!st->contains("bucket")) {
    std::fprintf(stderr, "spotvisor sync: no bucket is configured, nothing to sync to\n");
    return 5;
  }
  std::string before = st->contains("last_sync") ? (*st)["last_sync"].dump() : "";
  if (int rc = SignalDaemon("spotvisor sync", state_dir, *st, SIGUSR1); rc != 0) return rc;
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
      std::printf("%s sync #%lld done: %d file(s), %s uploaded\n", ls.value("kind", "").c_str(),
                  static_cast<long long>(ls.value("sequence", 0)), ls.value("files_uploaded", 0),
                  FormatBytes(ls.value("bytes", std::uint64_t{0})).c_str());
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
  int pid = Writer(*st).pid;
  if (int rc = SignalDaemon("spotvisor release", state_dir, *st, 0); rc != 0) return rc;
  if (Phase(*st) != "holding") {
    std::fprintf(stderr, "spotvisor release: nothing to release (phase: %s)\n", Phase(*st).c_str());
    return 2;
  }
  if (int rc = SignalDaemon("spotvisor release", state_dir, *st, SIGUSR2); rc != 0) return rc;
  std::printf("released: spotvisor (pid %d) goes on to on-exit\n", pid);
  return 0;
}

}  // namespace spotvisor
