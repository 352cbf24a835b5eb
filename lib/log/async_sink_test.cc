#include "log/async_sink.h"

#include <catch2/catch.hpp>
#include <condition_variable>
#include <mutex>

namespace spotvisor {
namespace {

// An inner sink that blocks every write until opened: a stdout nobody reads.
class GatedSink final : public LogSink {
 public:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool open = false;
    bool entered = false;
    std::vector<std::string> written;
  };
  explicit GatedSink(std::shared_ptr<Shared> s) : s_(std::move(s)) {}
  void Write(const LogEvent& e, WallTime, const std::map<std::string, std::string>&) override {
    std::unique_lock lk(s_->mu);
    s_->entered = true;
    s_->cv.notify_all();
    s_->cv.wait(lk, [&] { return s_->open; });
    s_->written.push_back(e.event + ":" + e.message);
  }

 private:
  std::shared_ptr<Shared> s_;
};

LogEvent Output(int i) { return {Severity::kInfo, "trainer.output", std::to_string(i), {}}; }

TEST_CASE("a blocked reader drops trainer output beyond the bound, never spotvisor's events") {
  auto shared = std::make_shared<GatedSink::Shared>();
  {
    AsyncSink sink(std::make_unique<GatedSink>(shared), /*max_queued=*/3);
    sink.Write(Output(0), {}, {});
    {
      // The writer thread is now stuck inside the first write.
      std::unique_lock lk(shared->mu);
      shared->cv.wait(lk, [&] { return shared->entered; });
    }
    for (int i = 1; i <= 10; ++i) sink.Write(Output(i), {}, {});  // 3 queued, 7 dropped
    sink.Write({Severity::kWarning, "preemption.detected", "p", {}}, {}, {});
    CHECK(sink.dropped() == 7);
    {
      std::lock_guard lk(shared->mu);
      shared->open = true;
    }
    shared->cv.notify_all();
  }  // the destructor drains the queue
  CHECK(shared->written == std::vector<std::string>{
                               "trainer.output:0", "trainer.output:1", "trainer.output:2", "trainer.output:3",
                               "log.dropped:7 trainer output line(s) dropped: output arrived faster than it could be written",
                               "preemption.detected:p"});
}

TEST_CASE("what can be dropped") {
  CHECK(IsDroppable(Output(1)));
  CHECK(IsDroppable({Severity::kInfo, "shutdown.output", "", {}}));
  CHECK_FALSE(IsDroppable({Severity::kInfo, "run.end", "", {}}));
}

}  // namespace
}  // namespace spotvisor
