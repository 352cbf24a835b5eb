// One reading of /proc/PID/stat for every process: who is whose child,
// which group, how much CPU. Shared by reaping/leftover discovery and by
// idle detection.
#pragma once

#include <sys/types.h>

#include <vector>

namespace spotvisor {

struct ProcStat {
  pid_t pid = 0;
  pid_t ppid = 0;
  pid_t pgrp = 0;
  double cpu_seconds = 0;  // utime + stime
};

std::vector<ProcStat> ListProcesses();

}  // namespace spotvisor
