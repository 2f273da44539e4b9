// Cooperative parallel loop over the pieces of a call (frames of compress_into, frames of
// decompress_into): the calling thread works through the items itself and helper threads join
// in when they get a core. Unlike an OpenMP team, the caller never waits for a helper that has
// not started, and helpers sleep instead of spinning (they yield for 50 us after a task, in case
// the call posts another). On a machine whose cores are busy with other processes, an OpenMP
// barrier waiting for a descheduled thread (its partner spinning on the same core) turned a
// sub-millisecond call of 52 frames into tens of milliseconds; here the worst case is about the
// caller doing everything alone.
// Header-only, so every build that compiles the CPU codec (setup.py, the CUDA selftest, the
// fuzzers) gets it without a new source file.
#pragma once

#include <pthread.h>
#include <stddef.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace hl {
namespace parallel {

// One parallel_items call, shared with the helpers that join it.
struct Task {
  size_t n = 0;
  const std::function<void(size_t)>* fn = nullptr;
  std::atomic<size_t> next{0};
  int wanted = 0;   // helpers that may still join (guarded by the pool's lock)
  int active = 0;   // helpers inside run() (guarded by lock)
  std::mutex lock;
  std::condition_variable done;
  std::exception_ptr error;

  // Claims and runs items until none are left. Returns after its last item.
  void run() {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> g(lock);
        if (!error) error = std::current_exception();
      }
    }
  }
};

class Pool {
 public:
  static Pool& instance() { return *slot().load(); }

  // fn(i) for every i in [0, n), on the caller and up to helpers other threads; rethrows the
  // first exception an item threw, after every claimed item has finished.
  void run(size_t n, int helpers, const std::function<void(size_t)>& fn) {
    auto task = std::make_shared<Task>();
    task->n = n;
    task->fn = &fn;
    task->wanted = helpers;
    {
      std::lock_guard<std::mutex> g(lock_);
      while ((int)threads_.size() < helpers) threads_.emplace_back([this] { serve(); });
      tasks_.push_back(task);
      posted_.fetch_add(1);
    }
    wake_.notify_all();
    task->run();
    {
      // From here no helper can join; wait for those inside to finish their last item.
      std::lock_guard<std::mutex> g(lock_);
      tasks_.erase(std::find(tasks_.begin(), tasks_.end(), task));
    }
    std::unique_lock<std::mutex> g(task->lock);
    task->done.wait(g, [&] { return task->active == 0; });
    if (task->error) std::rethrow_exception(task->error);
  }

  // Wakes up to `helpers` helpers (starting them if needed) so that they are already looking out
  // for work when the caller posts it after some serial preparation (parsing headers): the
  // wake-up overlaps that work. A hint; nothing waits for it.
  void prewake(int helpers) {
    {
      std::lock_guard<std::mutex> g(lock_);
      while ((int)threads_.size() < helpers) threads_.emplace_back([this] { serve(); });
      ++prewakes_;
    }
    wake_.notify_all();
  }

 private:
  bool has_task() const {
    return std::any_of(tasks_.begin(), tasks_.end(),
                       [](const std::shared_ptr<Task>& t) { return t->wanted > 0; });
  }

  void serve() {
    std::unique_lock<std::mutex> g(lock_);
    for (;;) {
      // A call often posts its next loop right after this one (compress_into builds, then
      // writes): look out for it a few microseconds before sleeping, which costs a wake-up.
      const uint64_t seen = posted_.load();
      g.unlock();
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
      while (posted_.load() == seen && std::chrono::steady_clock::now() < until)
        std::this_thread::yield();
      g.lock();
      const uint64_t woken = prewakes_;
      wake_.wait(g, [&] { return has_task() || prewakes_ != woken; });
      if (!has_task()) continue;  // woken ahead of a call: look out for its work again
      std::shared_ptr<Task> task = *std::find_if(
          tasks_.begin(), tasks_.end(), [](const std::shared_ptr<Task>& t) { return t->wanted > 0; });
      --task->wanted;
      {
        std::lock_guard<std::mutex> t(task->lock);
        ++task->active;
      }
      g.unlock();
      task->run();
      {
        std::lock_guard<std::mutex> t(task->lock);
        --task->active;
      }
      task->done.notify_all();
      g.lock();
    }
  }

  static constexpr int kSpinUs = 50;
  std::atomic<uint64_t> posted_{0};  // tasks ever posted
  uint64_t prewakes_ = 0;            // prewake() calls (guarded by lock_)
  // The process's pool, never destroyed (helpers may outlive static destructors). A forked
  // child has none of the parent's helpers, and maybe a lock one of them held, so it starts a
  // pool of its own (the old one is left as it is).
  static std::atomic<Pool*>& slot() {
    static std::atomic<Pool*>* s = [] {
      auto* p = new std::atomic<Pool*>(new Pool);
      pthread_atfork(nullptr, nullptr, [] { slot().store(new Pool); });
      return p;
    }();
    return *s;
  }

  std::mutex lock_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Task>> tasks_;
  std::vector<std::thread> threads_;
};

// Wakes the helpers a coming parallel_items(.., threads, ..) will want.
inline void prewake(int threads) {
  if (threads > 1) Pool::instance().prewake(threads - 1);
}

// Runs fn(0) ... fn(n-1) on up to `threads` threads (the caller included), items claimed one
// at a time in order. threads <= 1 or n <= 1: all on the caller.
inline void parallel_items(size_t n, int threads, const std::function<void(size_t)>& fn) {
  if (threads <= 1 || n <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  Pool::instance().run(n, std::min<int>(threads, (int)n) - 1, fn);
}

}  // namespace parallel
}  // namespace hl
