#include "process/proc.h"

#include <dirent.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

#include <fmt/format.h>

namespace spotvisor {

std::vector<ProcStat> ListProcesses() {
  static const double kTicks = static_cast<double>(sysconf(_SC_CLK_TCK));
  std::vector<ProcStat> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    long pid = std::strtol(e->d_name, &end, 10);
    if (*end != '\0' || pid <= 0) continue;
    std::ifstream in(fmt::format("/proc/{}/stat", pid));
    std::string s;
    if (!std::getline(in, s)) continue;  // gone meanwhile
    // "PID (comm) state ppid pgrp ...": comm may hold spaces and parens.
    auto close = s.rfind(')');
    if (close == std::string::npos || close + 2 > s.size()) continue;
    std::istringstream rest(s.substr(close + 2));
    std::vector<std::string> f{std::istream_iterator<std::string>(rest), {}};
    // After "(comm) ": state(0) ppid(1) pgrp(2) ... utime(11) stime(12).
    if (f.size() < 13) continue;
    out.push_back({static_cast<pid_t>(pid), static_cast<pid_t>(std::atol(f[1].c_str())),
                   static_cast<pid_t>(std::atol(f[2].c_str())),
                   (std::atof(f[11].c_str()) + std::atof(f[12].c_str())) / kTicks});
  }
  closedir(d);
  return out;
}

}  // namespace spotvisor
