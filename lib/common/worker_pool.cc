#include "common/worker_pool.h"

#include <pthread.h>
#include <signal.h>

namespace spotvisor {
namespace {

sigset_t AsyncSignals() {
  sigset_t set;
  sigfillset(&set);
  // Synchronous signals belong to the thread that caused them.
  for (int s : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGABRT, SIGSYS}) sigdelset(&set, s);
  return set;
}

}  // namespace

std::thread StartSignalFreeThread(std::function<void()> fn) {
  sigset_t block = AsyncSignals(), old;
  pthread_sigmask(SIG_BLOCK, &block, &old);
  std::thread t(std::move(fn));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return t;
}

void BlockSignalsInThisThread() {
  signal(SIGPIPE, SIG_IGN);  // a closed stdout is an error to log, not a death
  sigset_t block = AsyncSignals();
  pthread_sigmask(SIG_BLOCK, &block, nullptr);
}

struct SignalWindow::Saved {
  sigset_t old;
};

SignalWindow::SignalWindow(const std::vector<int>& signals) : saved_(std::make_unique<Saved>()) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : signals) sigaddset(&set, s);
  pthread_sigmask(SIG_UNBLOCK, &set, &saved_->old);
}

SignalWindow::~SignalWindow() { pthread_sigmask(SIG_SETMASK, &saved_->old, nullptr); }

WorkerPool::WorkerPool(std::size_t threads) : state_(std::make_shared<State>()) {
  for (std::size_t i = 0; i < threads; ++i) {
    threads_.push_back(StartSignalFreeThread([st = state_] {
      for (;;) {
        std::function<void()> task;
        {
          std::unique_lock lk(st->mu);
          st->cv.wait(lk, [&] { return st->stopping || !st->queue.empty(); });
          if (st->queue.empty()) return;  // stopping, nothing left
          task = std::move(st->queue.front());
          st->queue.pop_front();
          ++st->running;
        }
        try {
          task();
        } catch (...) {
          std::lock_guard lk(st->mu);
          ++st->exceptions;
        }
        {
          std::lock_guard lk(st->mu);
          --st->running;
        }
        st->idle.notify_all();
      }
    }));
  }
}

WorkerPool::~WorkerPool() {
  if (!shut_) Shutdown(std::chrono::seconds(5));
}

void WorkerPool::Post(std::function<void()> task) {
  {
    std::lock_guard lk(state_->mu);
    if (state_->stopping) return;
    state_->queue.push_back(std::move(task));
  }
  state_->cv.notify_one();
}

std::size_t WorkerPool::Shutdown(std::chrono::milliseconds bound) {
  shut_ = true;
  {
    std::lock_guard lk(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  bool drained;
  {
    std::unique_lock lk(state_->mu);
    drained = state_->idle.wait_for(lk, bound, [&] { return state_->queue.empty() && state_->running == 0; });
  }
  std::size_t left = 0;
  for (auto& t : threads_) {
    if (!t.joinable()) continue;
    if (drained) {
      t.join();
    } else {
      t.detach();
      ++left;
    }
  }
  return drained ? 0 : left;
}

std::size_t WorkerPool::exceptions() const {
  std::lock_guard lk(state_->mu);
  return state_->exceptions;
}

}  // namespace spotvisor
