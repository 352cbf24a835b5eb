// One reading of /proc/PID/stat for every process: who is whose child,
// which group, how much CPU. Shared by reaping/leftover discovery and by
// idle detection. And who a pid is, so a stale pid is never signalled.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace spotvisor {

struct ProcStat {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgrp = 0;
  double cpu_seconds = 0;  // utime + stime
  std::uint64_t start_ticks = 0;  // field 22: clock ticks after boot
  std::string comm;
};

std::vector<ProcStat> ListProcesses();

// Parses one /proc/PID/stat line ("PID (comm) state ppid pgrp ..."; comm
// may hold spaces and parentheses). nullopt when it is not one.
std::optional<ProcStat> ParseProcStat(const std::string& line);
// /proc/PID/stat read now; NotFound once the process is gone.
StatusOr<ProcStat> ReadProcStat(pid_t pid);

// What a process that writes its pid somewhere should record beside it, so
// a reader can tell it from a later process given the same pid: the start
// time (clock ticks after boot, /proc/self/stat field 22) and the boot id.
StatusOr<std::uint64_t> SelfStartTicks();
std::string BootId();  // /proc/sys/kernel/random/boot_id; empty if unreadable

// A pid somebody recorded, with what they recorded about it.
struct RecordedProcess {
  pid_t pid = 0;
  std::optional<std::uint64_t> start_ticks;  // absent in files from before it was recorded
  std::string boot_id;                       // empty: not recorded
  std::string name;                          // the program it must be, when start_ticks is absent
};

// OkStatus when `now` (what /proc says about recorded.pid today, read on
// the boot `boot_id_now`) is the recorded process; FailedPrecondition
// naming what the pid is now when it was reused. Pure: for tests.
Status CheckSameProcess(const RecordedProcess& recorded, const ProcStat& now, const std::string& exe_name_now,
                        const std::string& boot_id_now);

// Sends `signo` to the recorded process only if the pid still names it.
// Race-free where pidfds exist (Linux >= 5.3): the pidfd is taken before the
// check and the signal goes through it, so a pid reused in between is never
// hit. NotFound: it has exited; FailedPrecondition: the pid was reused.
Status SignalRecordedProcess(const RecordedProcess& recorded, int signo);

}  // namespace spotvisor
