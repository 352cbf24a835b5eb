#include "common/worker_pool.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <future>
#include <stdexcept>

namespace spotvisor {
namespace {

using namespace std::chrono_literals;

TEST_CASE("the pool runs every task on its own threads, and an exception never leaves a thread") {
  WorkerPool pool(3);
  CHECK(pool.threads() == 3);
  std::atomic<int> ran{0};
  std::promise<void> all;
  for (int i = 0; i < 100; ++i) {
    pool.Post([&, i] {
      if (i == 50) throw std::runtime_error("a task that throws");
      if (++ran == 99) all.set_value();
    });
  }
  REQUIRE(all.get_future().wait_for(10s) == std::future_status::ready);
  CHECK(pool.Shutdown(10s) == 0);
  CHECK(ran == 99);
  CHECK(pool.exceptions() == 1);
}

TEST_CASE("shutdown is bounded: a task that does not return is left behind, not waited for") {
  auto release = std::make_shared<std::promise<void>>();
  auto released = release->get_future().share();
  auto started = std::make_shared<std::promise<void>>();
  {
    WorkerPool pool(2);
    pool.Post([released, started] {
      started->set_value();
      released.wait();  // stuck until the test lets it go
    });
    started->get_future().wait();
    CHECK(pool.Shutdown(50ms) == 2);  // both threads detached: one busy, one idle
  }
  release->set_value();  // the detached thread finishes on state it shares
}

TEST_CASE("threads started for spotvisor take no signals: only the loop's thread does") {
  std::promise<bool> blocked;
  auto t = StartSignalFreeThread([&] {
    sigset_t mask;
    pthread_sigmask(SIG_SETMASK, nullptr, &mask);
    blocked.set_value(sigismember(&mask, SIGTERM) && sigismember(&mask, SIGCHLD) && sigismember(&mask, SIGHUP) &&
                      !sigismember(&mask, SIGSEGV));
  });
  CHECK(blocked.get_future().get());
  t.join();
  // The caller's own mask is unchanged.
  sigset_t mine;
  pthread_sigmask(SIG_SETMASK, nullptr, &mine);
  CHECK_FALSE(sigismember(&mine, SIGTERM));
}

}  // namespace
}  // namespace spotvisor
