// What the log API sinks (Cloud Logging, CloudWatch Logs) share: Write
// never blocks the caller (it queues); a thread of the sink's own sends
// batches, bounded by count and bytes, when a batch is full, when asked to
// flush, or `batch_delay` after its first entry; the queue is bounded and
// trainer output beyond it is dropped and counted (a log.dropped entry goes
// where the gap is); Flush waits with a deadline; a delivery problem is
// said once on stderr (spotvisor's own logs cannot report that they
// failed). The service specifics (how an event becomes entries, how a
// batch is sent and retried) are the subclass's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "log/logger.h"

namespace spotvisor {

class BatchingSink : public LogSink {
 public:
  struct Limits {
    std::size_t max_queued = 10'000;  // events waiting; trainer output beyond is dropped
    std::size_t batch_entries = 500;
    std::size_t batch_bytes = 4u << 20;  // a batch never exceeds it (unless one entry alone does)
    std::chrono::milliseconds batch_delay{1000};
  };
  // One entry as the service takes it, serialised once.
  struct Entry {
    std::string body;
    std::size_t bytes = 0;        // what it counts against batch_bytes
    int channel = 0;              // the subclass's (a log stream)
    std::int64_t time_ms = 0;     // the event's time
  };
  struct Counters {
    std::uint64_t sent = 0, dropped = 0, failed_batches = 0, requests = 0;
  };

  void Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels) override;
  void Flush(std::chrono::milliseconds timeout) override;
  Counters counters() const;

 protected:
  // `service` names the destination in drop notices and stderr lines.
  BatchingSink(Limits limits, std::string service);
  ~BatchingSink() override;
  // The subclass's constructor calls Start last, its destructor Stop first
  // (the thread calls the virtual functions below).
  void Start();
  void Stop();

  // Appends the entries for one event (usually one).
  virtual void Encode(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels,
                      std::vector<Entry>& out) = 0;
  struct SendResult {
    std::size_t sent = 0, failed = 0;
    std::string problem;  // why some failed, for stderr
    // What makes two problems the same one (said once): `problem` if empty.
    std::string problem_kind;
  };
  // Delivers a batch (retrying as the service allows). Called on the
  // sink's thread only.
  virtual SendResult Send(std::vector<Entry>& batch) = 0;
  // Cuts a Send short (the sink is stopping): wake backoff waits, abort requests.
  virtual void Interrupt() = 0;
  void CountRequest();

 private:
  struct Queued {
    LogEvent event;
    WallTime time;
    std::map<std::string, std::string> labels;
  };
  void Run();

  const Limits limits_;
  const std::string service_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Queued> queue_;  // raw: entries are built on the sink's thread, not the caller's
  std::size_t carried_ = 0;   // entries encoded but not yet in a batch (they did not fit)
  std::uint64_t unreported_drops_ = 0;
  bool sending_ = false;
  bool flush_requested_ = false;
  bool stopping_ = false;
  Counters counters_;
  std::string stderr_note_;  // the last delivery problem, said once on stderr
  std::thread thread_;
};

// `text` cut into pieces of at most `max` bytes (at least 1), never inside
// a UTF-8 sequence (unless a sequence is longer than `max`).
std::vector<std::string> SplitUtf8(std::string_view text, std::size_t max);

}  // namespace spotvisor
