#include "activity/activity.h"

#include "process/proc.h"

#include <dirent.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>

namespace spotvisor {
namespace {

std::set<pid_t> Tree(pid_t root, const std::map<pid_t, ProcStat>& procs) {
  std::set<pid_t> tree;
  if (!procs.count(root)) return tree;
  tree.insert(root);
  for (bool grew = true; grew;) {
    grew = false;
    for (auto const& [pid, p] : procs) {
      if (!tree.count(pid) && tree.count(p.ppid)) grew = tree.insert(pid).second;
    }
  }
  return tree;
}

std::set<unsigned long> SocketInodes(const std::set<pid_t>& tree) {
  std::set<unsigned long> inodes;
  for (pid_t pid : tree) {
    auto dir = fmt::format("/proc/{}/fd", pid);
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      char target[128];
      ssize_t n = readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      unsigned long inode = 0;
      if (std::sscanf(target, "socket:[%lu]", &inode) == 1) inodes.insert(inode);
    }
    closedir(d);
  }
  return inodes;
}

// Connections made to a port the tree listens on, from /proc/net/tcp{,6}.
int IncomingConnections(const std::set<unsigned long>& inodes) {
  struct Sock {
    unsigned port;
    int state;
    unsigned long inode;
  };
  std::vector<Sock> socks;
  for (const char* path : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream ss(line);
      std::string sl, local, remote, st, queues, tr, retr, uid, timeout, inode;
      ss >> sl >> local >> remote >> st >> queues >> tr >> retr >> uid >> timeout >> inode;
      auto colon = local.rfind(':');
      if (colon == std::string::npos) continue;
      socks.push_back({static_cast<unsigned>(std::stoul(local.substr(colon + 1), nullptr, 16)),
                       static_cast<int>(std::stoul(st, nullptr, 16)), std::stoul(inode)});
    }
  }
  constexpr int kEstablished = 1, kListen = 10;
  std::set<unsigned> listening;
  for (auto const& s : socks) {
    if (s.state == kListen && inodes.count(s.inode)) listening.insert(s.port);
  }
  int n = 0;
  for (auto const& s : socks) {
    if (s.state == kEstablished && inodes.count(s.inode) && listening.count(s.port)) ++n;
  }
  return n;
}

// NVML, loaded at run time so the binary runs on VMs without NVIDIA's driver.
class Nvml {
 public:
  Nvml() {
    handle_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!handle_) {
      reason_ = "libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver?): idle detection uses CPU and connections only";
      return;
    }
    init_ = reinterpret_cast<int (*)()>(dlsym(handle_, "nvmlInit_v2"));
    count_ = reinterpret_cast<int (*)(unsigned*)>(dlsym(handle_, "nvmlDeviceGetCount_v2"));
    get_ = reinterpret_cast<int (*)(unsigned, void**)>(dlsym(handle_, "nvmlDeviceGetHandleByIndex_v2"));
    util_ = reinterpret_cast<int (*)(void*, unsigned*)>(dlsym(handle_, "nvmlDeviceGetUtilizationRates"));
    if (!init_ || !count_ || !get_ || !util_ || init_() != 0) {
      reason_ = "NVML could not be initialised: idle detection uses CPU and connections only";
      init_ = nullptr;
    }
  }
  ~Nvml() {
    if (handle_) dlclose(handle_);
  }
  const std::string& reason() const { return reason_; }

  std::optional<double> BusiestGpuPercent() {
    if (!init_) return std::nullopt;
    unsigned n = 0;
    if (count_(&n) != 0) return std::nullopt;
    double best = 0;
    for (unsigned i = 0; i < n; ++i) {
      void* dev = nullptr;
      unsigned rates[2] = {0, 0};  // nvmlUtilization_t: gpu, memory
      if (get_(i, &dev) == 0 && util_(dev, rates) == 0) best = std::max(best, static_cast<double>(rates[0]));
    }
    return best;
  }

 private:
  void* handle_ = nullptr;
  int (*init_)() = nullptr;
  int (*count_)(unsigned*) = nullptr;
  int (*get_)(unsigned, void**) = nullptr;
  int (*util_)(void*, unsigned*) = nullptr;
  std::string reason_;
};

class ProcActivitySampler final : public ActivitySampler {
 public:
  ActivitySample Sample(pid_t root) override {
    std::map<pid_t, ProcStat> procs;
    for (auto const& p : ListProcesses()) procs[p.pid] = p;
    auto tree = Tree(root, procs);
    ActivitySample s;
    for (pid_t pid : tree) s.cpu_seconds += procs[pid].cpu_seconds;
    s.gpu_percent = nvml_.BusiestGpuPercent();
    s.incoming_connections = IncomingConnections(SocketInodes(tree));
    return s;
  }
  std::string GpuUnavailableReason() const override { return nvml_.reason(); }

 private:
  Nvml nvml_;
};

}  // namespace

std::unique_ptr<ActivitySampler> MakeProcActivitySampler() { return std::make_unique<ProcActivitySampler>(); }

void IdleDetector::Reset(SteadyTime now) {
  last_time_.reset();
  idle_since_ = now;
}

std::chrono::milliseconds IdleDetector::Observe(SteadyTime now, const ActivitySample& s) {
  bool active = s.incoming_connections > 0 || (s.gpu_percent && *s.gpu_percent > gpu_percent_);
  if (last_time_) {
    double wall = std::chrono::duration<double>(now - *last_time_).count();
    // A process that exited takes its CPU time with it: never negative.
    double cpu = std::max(0.0, s.cpu_seconds - last_cpu_);
    if (wall > 0 && cpu / wall * 100.0 > cpu_percent_) active = true;
  } else {
    idle_since_ = now;
  }
  last_time_ = now;
  last_cpu_ = s.cpu_seconds;
  if (active) idle_since_ = now;
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - idle_since_);
}

}  // namespace spotvisor
