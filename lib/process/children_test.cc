#include "process/children.h"

#include <sys/wait.h>

#include <catch2/catch.hpp>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

SpawnOptions Sh(const std::string& script) {
  SpawnOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.env = {"PATH=/usr/bin:/bin"};
  return o;
}

TEST_CASE("a registered child's status goes to its owner, whoever reaps it") {
  ChildRegistry reg;
  int seen = -1;
  pid_t recorded = 0;
  auto p = reg.Spawn(Sh("exit 7"), [&](int status) { seen = status; }, [&](pid_t pid) { recorded = pid; });
  REQUIRE(p.ok());
  CHECK(recorded == p->pid);  // recorded before anything could reap it
  // Wait reaps it itself when no reaper runs.
  auto st = reg.Wait(p->pid, 10s);
  REQUIRE(st.has_value());
  CHECK(WEXITSTATUS(*st) == 7);
  CHECK(WEXITSTATUS(seen) == 7);
  CHECK_FALSE(reg.Registered(p->pid));
}

TEST_CASE("ReapAll hands unregistered children to the caller and registered ones to their owners") {
  ChildRegistry reg;
  auto mine = reg.Spawn(Sh("exit 3"));
  REQUIRE(mine.ok());
  auto other = Spawn(Sh("exit 4"));  // like the trainer: not registered
  REQUIRE(other.ok());
  std::vector<std::pair<pid_t, int>> others;
  // Block until some child has exited (WNOWAIT: without reaping it), then reap
  // as the supervisor does, until both are collected.
  while (others.empty() || reg.Registered(mine->pid)) {
    siginfo_t info{};
    REQUIRE(waitid(P_ALL, 0, &info, WEXITED | WNOWAIT) == 0);
    reg.ReapAll([&](pid_t pid, int status) { others.emplace_back(pid, status); });
  }
  REQUIRE(others.size() == 1);
  CHECK(others[0].first == other->pid);
  CHECK(WEXITSTATUS(others[0].second) == 4);
  auto st = reg.Wait(mine->pid, 1s);  // already delivered: returned at once
  REQUIRE(st.has_value());
  CHECK(WEXITSTATUS(*st) == 3);
}

TEST_CASE("Run captures output and kills what outlives its timeout") {
  ChildRegistry reg;
  std::string out;
  auto r = reg.Run(Sh("echo hello; echo oops >&2; exit 2"), 10s, &out);
  REQUIRE(r.ok());
  CHECK(WEXITSTATUS(*r) == 2);
  CHECK(out.find("hello") != std::string::npos);
  CHECK(out.find("oops") != std::string::npos);
  auto slow = reg.Run(Sh("sleep 30"), 200ms, &out);
  REQUIRE_FALSE(slow.ok());
  CHECK(slow.status().code() == StatusCode::kDeadlineExceeded);
  std::atomic<bool> cancelled{true};
  auto cut = reg.Run(Sh("sleep 30"), 30s, &out, &cancelled);
  REQUIRE_FALSE(cut.ok());
  CHECK(cut.status().code() == StatusCode::kCancelled);
}

}  // namespace
}  // namespace spotvisor
