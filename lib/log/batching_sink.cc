#include "log/batching_sink.h"

#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "log/async_sink.h"

namespace spotvisor {

std::vector<std::string> SplitUtf8(std::string_view text, std::size_t max) {
  if (max == 0) max = 1;
  std::vector<std::string> parts;
  for (std::size_t at = 0; at < text.size();) {
    std::size_t n = std::min(max, text.size() - at);
    // Never cut inside a UTF-8 sequence.
    while (n > 0 && at + n < text.size() && (static_cast<unsigned char>(text[at + n]) & 0xC0) == 0x80) --n;
    if (n == 0) n = std::min(max, text.size() - at);
    parts.emplace_back(text.substr(at, n));
    at += n;
  }
  return parts;
}

BatchingSink::BatchingSink(Limits limits, std::string service) : limits_(limits), service_(std::move(service)) {}

// Stop() calls the subclass's Interrupt(), which no longer exists while this
// base destructor runs: every subclass stops the thread in its own
// destructor. One that forgets is a programming error, said and ended here
// rather than a call through a dead vtable.
BatchingSink::~BatchingSink() {
  if (thread_.joinable()) {
    std::fprintf(stderr, "spotvisor: BatchingSink for %s destroyed with its thread running (the subclass must call "
                         "Stop() in its destructor)\n",
                 service_.c_str());
    std::abort();
  }
}

void BatchingSink::Start() { thread_ = std::thread([this] { Run(); }); }

void BatchingSink::Stop() {
  if (!thread_.joinable()) return;
  // Owners flush with their own deadline first (Logger::Flush); this is the
  // last, short chance for what came after.
  Flush(std::chrono::seconds(1));
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    if (!queue_.empty() || carried_ > 0) {
      // Said where it can still be seen: these entries are lost.
      std::fprintf(stderr, "spotvisor: %zu log entries not delivered to %s before exit\n", queue_.size() + carried_,
                   service_.c_str());
    }
  }
  cv_.notify_all();
  Interrupt();
  thread_.join();
}

void BatchingSink::Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels) {
  {
    std::lock_guard lk(mu_);
    if (IsDroppable(e) && queue_.size() >= limits_.max_queued) {
      ++counters_.dropped;
      ++unreported_drops_;
      return;
    }
    if (unreported_drops_ > 0) {
      // The notice goes where the gap is.
      queue_.push_back(Queued{LogEvent{Severity::kWarning, "log.dropped",
                                       fmt::format("{} trainer output line(s) not sent to {}: they came faster "
                                                   "than they could be sent",
                                                   unreported_drops_, service_),
                                       {{"dropped", unreported_drops_}}},
                              time, labels});
      unreported_drops_ = 0;
    }
    queue_.push_back(Queued{e, time, labels});
  }
  cv_.notify_one();
}

void BatchingSink::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock lk(mu_);
  flush_requested_ = true;
  cv_.notify_all();
  idle_.wait_for(lk, timeout, [this] { return queue_.empty() && carried_ == 0 && !sending_; });
  flush_requested_ = false;
}

BatchingSink::Counters BatchingSink::counters() const {
  std::lock_guard lk(mu_);
  return counters_;
}

void BatchingSink::CountRequest() {
  std::lock_guard lk(mu_);
  ++counters_.requests;
}

void BatchingSink::Run() {
  std::unique_lock lk(mu_);
  std::vector<Entry> batch;
  std::deque<Entry> carry;  // encoded, waiting for room in a batch
  std::vector<Entry> encoded;
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty() || !carry.empty(); });
    if (stopping_ && queue_.empty() && carry.empty()) return;
    // A batch goes when it is full, when asked to flush, or batch_delay
    // after its first entry arrived.
    cv_.wait_for(lk, limits_.batch_delay, [&] {
      return stopping_ || flush_requested_ || queue_.size() + carry.size() >= limits_.batch_entries;
    });
    sending_ = true;
    std::size_t bytes = 0;
    while (batch.size() < limits_.batch_entries) {
      if (carry.empty()) {
        if (queue_.empty()) break;
        Queued q = std::move(queue_.front());
        queue_.pop_front();
        lk.unlock();
        encoded.clear();
        Encode(q.event, q.time, q.labels, encoded);
        lk.lock();
        for (auto& e : encoded) carry.push_back(std::move(e));
        carried_ = carry.size();
        continue;
      }
      if (!batch.empty() && bytes + carry.front().bytes > limits_.batch_bytes) break;
      bytes += carry.front().bytes;
      batch.push_back(std::move(carry.front()));
      carry.pop_front();
      carried_ = carry.size();
    }
    lk.unlock();
    SendResult r = batch.empty() ? SendResult{} : Send(batch);
    lk.lock();
    batch.clear();
    sending_ = false;
    counters_.sent += r.sent;
    if (r.failed > 0) {
      ++counters_.failed_batches;
      counters_.dropped += r.failed;
      const std::string& kind = r.problem_kind.empty() ? r.problem : r.problem_kind;
      if (kind != stderr_note_) {
        stderr_note_ = kind;
        std::fprintf(stderr, "spotvisor: %zu log entries not delivered to %s: %s\n", r.failed, service_.c_str(),
                     r.problem.c_str());
      }
    }
    if (queue_.empty() && carry.empty()) idle_.notify_all();
  }
}

}  // namespace spotvisor
