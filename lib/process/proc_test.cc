#include "process/proc.h"

#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

#include <catch2/catch.hpp>

#include "process/spawn.h"

namespace spotvisor {
namespace {

TEST_CASE("ParseProcStat reads fields around a comm with spaces and parentheses") {
  auto p = ParseProcStat("4242 (we ird) (x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 150 0 0 20 0 1 0 987654 1000 10");
  REQUIRE(p.has_value());
  CHECK(p->pid == 4242);
  CHECK(p->comm == "we ird) (x");
  CHECK(p->ppid == 1);
  CHECK(p->pgrp == 4242);
  CHECK(p->start_ticks == 987654u);
  CHECK(p->cpu_seconds == Approx(400.0 / static_cast<double>(sysconf(_SC_CLK_TCK))));
  CHECK_FALSE(ParseProcStat("").has_value());
  CHECK_FALSE(ParseProcStat("12 (short) S 1 2").has_value());
  CHECK_FALSE(ParseProcStat("x (a) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 0 0 0 0 5").has_value());
}

TEST_CASE("our own start time is what /proc says about our pid") {
  auto ticks = SelfStartTicks();
  REQUIRE(ticks.ok());
  CHECK(*ticks > 0u);
  auto me = ReadProcStat(getpid());
  REQUIRE(me.ok());
  CHECK(me->start_ticks == *ticks);
  CHECK(BootId().size() == 36);
  CHECK(ReadProcStat(0).status().code() != StatusCode::kOk);
}

TEST_CASE("CheckSameProcess tells the recorded process from a reused pid") {
  ProcStat now;
  now.pid = 77;
  now.start_ticks = 1000;
  now.comm = "sleep";
  RecordedProcess r{77, 1000, "boot-a", "spotvisor"};
  CHECK(CheckSameProcess(r, now, "sleep", "boot-a").ok());  // the start time decides
  r.start_ticks = 999;
  auto s = CheckSameProcess(r, now, "sleep", "boot-a");
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  CHECK(s.message().find("pid 77 is now \"sleep\"") != std::string::npos);
  r.start_ticks = 1000;
  CHECK(CheckSameProcess(r, now, "sleep", "boot-b").code() == StatusCode::kFailedPrecondition);
  CHECK(CheckSameProcess(r, now, "sleep", "").ok());  // no boot id to compare
  // Written before start times were recorded: the program name decides.
  r.start_ticks.reset();
  CHECK(CheckSameProcess(r, now, "sleep", "boot-a").code() == StatusCode::kFailedPrecondition);
  CHECK(CheckSameProcess(r, now, "spotvisor", "boot-a").ok());
  now.comm = "spotvisor";
  CHECK(CheckSameProcess(r, now, "", "boot-a").ok());  // exe unreadable: comm
  CHECK(CheckSameProcess(r, now, "python3", "boot-a").code() == StatusCode::kFailedPrecondition);
}

// The process's fate: SIGUSR1 kills it (default action), so a signal that
// should not have been sent shows in its wait status.
int KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFSIGNALED(status) ? WTERMSIG(status) : -1;
}

TEST_CASE("SignalRecordedProcess signals only the process that was recorded") {
  SpawnOptions o;
  o.argv = {"/bin/sleep", "600"};
  auto p = Spawn(o);
  REQUIRE(p.ok());
  auto stat = ReadProcStat(p->pid);
  REQUIRE(stat.ok());
  RecordedProcess wrong{p->pid, stat->start_ticks + 1, BootId(), "spotvisor"};
  auto s = SignalRecordedProcess(wrong, SIGUSR1);
  CHECK(s.code() == StatusCode::kFailedPrecondition);
  RecordedProcess by_name{p->pid, std::nullopt, "", "spotvisor"};
  CHECK(SignalRecordedProcess(by_name, SIGUSR1).code() == StatusCode::kFailedPrecondition);
  CHECK(KillAndReap(p->pid) == SIGKILL);  // SIGUSR1 would have come first

  auto q = Spawn(o);
  REQUIRE(q.ok());
  RecordedProcess right{q->pid, ReadProcStat(q->pid)->start_ticks, BootId(), "sleep"};
  CHECK(SignalRecordedProcess(right, 0).ok());
  CHECK(SignalRecordedProcess(right, SIGUSR1).ok());
  CHECK(KillAndReap(q->pid) == SIGUSR1);
  CHECK(SignalRecordedProcess(right, 0).code() == StatusCode::kNotFound);
}

}  // namespace
}  // namespace spotvisor
