#include "supervisor/observers.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

class FakeClock final : public Clock {
 public:
  SteadyTime Now() const override { return now; }
  WallTime WallNow() const override { return WallTime{} + std::chrono::hours(24 * 365 * 56); }
  SteadyTime now{std::chrono::hours(1)};
};

class RecordingNotifier final : public ServiceNotifier {
 public:
  Status Notify(const std::string& message) override {
    messages.push_back(message);
    return OkStatus();
  }
  std::optional<std::chrono::microseconds> WatchdogInterval() const override { return std::nullopt; }
  std::vector<std::string> messages;
};

class RecordingSink final : public LogSink {
 public:
  void Write(const LogEvent& e, WallTime, const std::map<std::string, std::string>&) override { events.push_back(e.event); }
  std::vector<std::string> events;
};

RunView Running() {
  RunView v;
  v.run_id = "exp1";
  v.mode = "daemon";
  v.phase = "running";
  v.state = "running";
  v.trainer_pid = 42;
  v.last_event = "trainer.start";
  v.last_message = "trainer started as pid 42";
  return v;
}

TEST_CASE("systemd hears STATUS once per change, STOPPING=1 once, and an extension covering the state's deadline") {
  boost::asio::io_context io;
  FakeClock clock;
  auto notifier = std::make_shared<RecordingNotifier>();
  SystemdObserver o(io, clock, notifier);
  auto v = Running();
  o.OnChange(v);
  o.OnChange(v);  // nothing new: nothing sent
  REQUIRE(notifier->messages == std::vector<std::string>{"STATUS=running; trainer pid 42"});
  v.phase = "stopping";
  v.state = "stopping/SIGINT";
  v.reason = "preempted";
  v.ending = true;
  v.deadline = clock.now + 20s;
  o.OnChange(v);
  REQUIRE(notifier->messages.size() == 3);
  CHECK(notifier->messages[1] == "STATUS=stopping (preempted); trainer pid 42\nSTOPPING=1");
  CHECK(notifier->messages[2] == "EXTEND_TIMEOUT_USEC=35000000");  // 20 s left + 15 s
  v.state = "stopping/SIGTERM";  // the same summary: not sent again
  o.OnChange(v);
  CHECK(notifier->messages.size() == 3);
  o.Close();  // the process is exiting: its last state is still said, with no more extensions
  v.phase = "done";
  v.state = "done";
  v.trainer_pid.reset();
  o.OnChange(v);
  CHECK(notifier->messages.size() == 4);
  CHECK(notifier->messages.back() == "STATUS=done (preempted)");
}

TEST_CASE("the systemd summary reads a last sync of any shape without throwing") {
  auto v = Running();
  v.last_sync = {{"ok", true}, {"sequence", 7}, {"time", "2026-11-24T12:00:00Z"}};
  CHECK(SystemdObserver::Summary(v) == "running; trainer pid 42; last sync #7 at 2026-11-24T12:00:00Z");
  v.last_sync = {{"ok", "yes"}, {"sequence", "7"}, {"time", 3}};
  CHECK(SystemdObserver::Summary(v) == "running; trainer pid 42; last sync FAILED at ");
}

TEST_CASE("status.json carries the phase, the state and the deadline, a write failure is logged once") {
  FakeClock clock;
  Logger logger(clock);
  auto sink = std::make_unique<RecordingSink>();
  auto* events = &sink->events;
  logger.AddSink(std::move(sink));
  char tmpl[] = "/tmp/spotvisor-observers-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  StatusFileObserver o(dir, clock, logger);
  auto v = Running();
  v.deadline = clock.now + 90s;
  auto j = o.Json(v);
  CHECK(j["phase"] == "running");
  CHECK(j["state"] == "running");
  CHECK(j["trainer_pid"] == 42);
  CHECK(j.contains("deadline"));
  CHECK_FALSE(j.contains("exit_code"));
  o.OnChange(v);
  std::ifstream in(dir + "/status.json");
  std::stringstream ss;
  ss << in.rdbuf();
  CHECK(nlohmann::json::parse(ss.str())["last_event"]["event"] == "trainer.start");
  CHECK(events->empty());
  StatusFileObserver broken(dir + "/status.json/not-a-dir", clock, logger);
  broken.OnChange(v);
  broken.OnChange(v);
  CHECK(std::count(events->begin(), events->end(), "status.write_failed") == 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace spotvisor
