// Writes log entries to the Cloud Logging API itself (entries.write), as
// Google's guest agent does: Debian 12 images have no rsyslog, the Ops
// Agent does not read journald unless configured, and the legacy agent does
// not support Debian 12.
//
// Entries are batched (by count, bytes and time) and sent from a thread of
// their own; 429 and 5xx are retried with backoff; the queue is bounded and
// trainer output beyond it is dropped and counted (a log.dropped entry says
// how many); Flush() is called with a deadline before on-exit, so the lines
// that say why the VM stopped are not lost at poweroff.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "common/clock.h"
#include "http/http_client.h"
#include "log/batching_sink.h"
#include "log/logger.h"
#include "retry/sleeper.h"
#include "storage/token_provider.h"

namespace spotvisor {

struct CloudLoggingOptions {
  std::string endpoint = "https://logging.googleapis.com";  // /v2/entries:write is appended
  std::string project_id, instance_id, zone;               // the gce_instance resource
  std::map<std::string, std::string> labels;               // log-labels, on every entry
  std::size_t max_queued = 10'000;                         // entries waiting; trainer output beyond is dropped
  std::size_t batch_entries = 500;
  std::size_t batch_bytes = 4u << 20;                      // the API takes up to 10 MB a request
  std::size_t max_entry_bytes = 200'000;                   // the API takes ~256 KB an entry
  std::chrono::milliseconds batch_delay{1000};             // a partial batch waits at most this long
  std::chrono::milliseconds retry_budget{30'000};          // per batch, then it is dropped and counted
};

class CloudLoggingSink final : public BatchingSink {
 public:
  CloudLoggingSink(CloudLoggingOptions options, std::unique_ptr<TokenProvider> tokens,
                   std::unique_ptr<HttpClient> http);
  ~CloudLoggingSink() override;  // flushes for at most 1 s more

  // The entries for one event (exposed for tests): logName
  // spotvisor-trainer for trainer output, spotvisor for everything else.
  // Usually one; an event above the API's entry size limit is split into
  // several, its message cut into parts (jsonPayload.part / parts) on UTF-8
  // boundaries, each carrying the event's other fields. Each entry has its
  // own insertId.
  std::vector<nlohmann::json> MakeEntries(const LogEvent& e, WallTime time,
                                          const std::map<std::string, std::string>& labels) const;

 private:
  void Encode(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels,
              std::vector<Entry>& out) override;
  SendResult Send(std::vector<Entry>& batch) override;
  void Interrupt() override;

  CloudLoggingOptions o_;
  std::unique_ptr<TokenProvider> tokens_;
  std::unique_ptr<HttpClient> http_;
  CancellableSleeper sleeper_;
  SystemClock clock_;  // the retry budget
  // insertId = PREFIX-N (PREFIX random per process, N counting entries):
  // Cloud Logging treats entries with the same timestamp and insertId as
  // one, so resending a batch whose answer was lost adds no duplicates.
  const std::string insert_prefix_;
  mutable std::atomic<std::uint64_t> next_insert_{0};
};

// "projects/P/logs/NAME", NAME URL-encoded as the API requires.
std::string LogName(const std::string& project, const std::string& name);

}  // namespace spotvisor
