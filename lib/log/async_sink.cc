#include "log/async_sink.h"

#include <fmt/format.h>

namespace spotvisor {

bool IsDroppable(const LogEvent& e) { return e.event == "trainer.output" || e.event == "shutdown.output"; }

AsyncSink::AsyncSink(std::unique_ptr<LogSink> inner, std::size_t max_queued)
    : inner_(std::move(inner)), max_queued_(max_queued), thread_([this] { Run(); }) {}

AsyncSink::~AsyncSink() {
  std::unique_lock lk(mu_);
  if (dropped_unreported_ > 0) {
    ReportDropsLocked(last_time_, last_labels_);
    cv_.notify_one();
  }
  // Give the writer a bounded time to empty the queue: the last lines say
  // why the run ended, but a reader that never reads must not hang exit.
  bool drained = drained_.wait_for(lk, std::chrono::seconds(5), [this] { return queue_.empty() && !writing_; });
  stopping_ = true;
  lk.unlock();
  cv_.notify_all();
  if (drained) {
    thread_.join();
  } else {
    thread_.detach();  // blocked in write(2); the process is exiting anyway
    inner_.release();  // the detached thread may still be using it
  }
}

void AsyncSink::Write(const LogEvent& e, WallTime time, const std::map<std::string, std::string>& labels) {
  {
    std::lock_guard lk(mu_);
    if (IsDroppable(e) && queue_.size() >= max_queued_) {
      last_time_ = time;
      ++dropped_total_;
      ++dropped_unreported_;
      return;
    }
    last_time_ = time;
    last_labels_ = labels;
    if (dropped_unreported_ > 0) ReportDropsLocked(time, labels);
    queue_.push_back(Item{e, time, labels});
  }
  cv_.notify_one();
}

// The notice goes into the queue where the gap is, so a reader sees exactly
// which stretch of output is missing.
void AsyncSink::ReportDropsLocked(WallTime time, const std::map<std::string, std::string>& labels) {
  auto n = std::exchange(dropped_unreported_, 0);
  queue_.push_back(Item{LogEvent{Severity::kWarning, "log.dropped",
                                 fmt::format("{} trainer output line(s) dropped: output arrived faster than it could be written", n),
                                 {{"dropped", n}}},
                        time, labels});
}

void AsyncSink::Flush(std::chrono::milliseconds timeout) {
  {
    std::unique_lock lk(mu_);
    drained_.wait_for(lk, timeout, [this] { return queue_.empty() && !writing_; });
  }
  inner_->Flush(timeout);
}

std::uint64_t AsyncSink::dropped() const {
  std::lock_guard lk(mu_);
  return dropped_total_;
}

// Takes everything queued at once and writes it with one flush at the end.
void AsyncSink::Run() {
  std::unique_lock lk(mu_);
  std::deque<Item> batch;
  for (;;) {
    cv_.wait(lk, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stopping_) return;
      continue;
    }
    batch.swap(queue_);
    writing_ = true;
    lk.unlock();
    for (auto const& item : batch) inner_->Write(item.event, item.time, item.labels);
    inner_->Flush(std::chrono::milliseconds(0));
    batch.clear();
    lk.lock();
    writing_ = false;
    if (queue_.empty()) drained_.notify_all();
  }
}

}  // namespace spotvisor
