// Writes log lines from a thread of its own, so that a slow reader of
// stdout (journald under load, a pipe nobody drains) can never block the
// event loop: a preemption must be handled even while the trainer floods its
// output. Trainer output beyond `max_queued` waiting lines is dropped and
// counted (a `log.dropped` event says how many); spotvisor's own events are
// never dropped.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "log/logger.h"

namespace spotvisor {

class AsyncSink final : public LogSink {
 public:
  AsyncSink(std::unique_ptr<LogSink> inner, std::size_t max_queued = 10'000);
  ~AsyncSink() override;  // drains what is queued, for at most 5 s

  void Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels) override;
  std::uint64_t dropped() const;
  void Flush(std::chrono::milliseconds timeout) override;

 private:
  struct Item {
    LogEvent event;
    WallTime time;
    std::map<std::string, std::string> labels;
  };
  void Run();
  void ReportDropsLocked(WallTime time, const std::map<std::string, std::string>& labels);

  std::unique_ptr<LogSink> inner_;
  std::size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable cv_, drained_;
  std::deque<Item> queue_;
  std::uint64_t dropped_total_ = 0, dropped_unreported_ = 0;
  WallTime last_time_{};  // for a drop notice at exit
  std::map<std::string, std::string> last_labels_;
  bool stopping_ = false;
  bool writing_ = false;
  std::thread thread_;
};

// Lines that may be dropped under pressure: the trainer's (and the shutdown
// command's) output, never spotvisor's own events.
bool IsDroppable(const LogEvent& e);

}  // namespace spotvisor
