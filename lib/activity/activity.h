// Is the trainer doing anything? For idle-timeout (an interactive server
// such as Jupyter on a VM that bills until stopped): CPU time of the
// trainer's process tree, GPU utilisation through NVML when it can be
// loaded, and TCP connections made *to* the tree (a browser on a notebook).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "common/clock.h"

namespace spotvisor {

struct ActivitySample {
  double cpu_seconds = 0;           // utime+stime summed over the tree's live processes
  std::optional<double> gpu_percent;  // busiest GPU; nullopt without NVML
  int incoming_connections = 0;     // ESTABLISHED TCP on a port the tree listens on
};

class ActivitySampler {
 public:
  virtual ~ActivitySampler() = default;
  virtual ActivitySample Sample(pid_t root) = 0;
  // "" when GPUs are measured; else why not (said once in the logs).
  virtual std::string GpuUnavailableReason() const = 0;
};

// Reads /proc; loads libnvidia-ml.so.1 with dlopen if present.
std::unique_ptr<ActivitySampler> MakeProcActivitySampler();

// Pure bookkeeping: fed samples with their times, says how long the tree
// has been idle. Active = CPU above `cpu_percent` of one core since the
// previous sample, or a GPU above `gpu_percent`, or an incoming connection.
class IdleDetector {
 public:
  IdleDetector(double cpu_percent, double gpu_percent) : cpu_percent_(cpu_percent), gpu_percent_(gpu_percent) {}
  // Returns how long the tree has been idle at `now`.
  std::chrono::milliseconds Observe(SteadyTime now, const ActivitySample& s);
  void Reset(SteadyTime now);  // e.g. a new trainer started

 private:
  double cpu_percent_, gpu_percent_;
  std::optional<SteadyTime> last_time_;
  double last_cpu_ = 0;
  SteadyTime idle_since_{};
};

}  // namespace spotvisor
