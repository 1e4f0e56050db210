// parallel_for: the one small thread pool for CPU work split into independent items (prep's
// tokenizing rounds, the raw-text index build). Background threads: idle priority, and a yield
// between pieces of work.
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

namespace lm {

// Runs work(i) for i < n on up to `threads` threads (the caller's included); rethrows the first
// exception after every thread stopped.
inline void parallel_for(size_t n, int threads, const std::function<void(size_t)>& work) {
  std::atomic<size_t> next{0};
  const size_t t_count = std::max<size_t>(1, std::min(n, static_cast<size_t>(std::max(threads, 1))));
  std::vector<std::exception_ptr> errors(t_count);
  auto loop = [&](size_t t) {
    try {
      for (size_t i; (i = next++) < n;) work(i);
    } catch (...) {
      errors[t] = std::current_exception();
      next = n;
    }
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < t_count; ++t) pool.emplace_back(loop, t);
  loop(0);
  for (auto& th : pool) th.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// A background thread (the async checkpoint writer) takes only CPU time the threads of training
// leave: it runs at idle priority (SCHED_IDLE) and calls yield_if_background() between pieces of
// its work (a piece: about a millisecond). Idle priority alone is not enough: OpenBLAS threads
// waiting for their next GEMM spin on sched_yield(), each yield hands the CPU to the background
// thread, and it would keep it until the next scheduler tick while the GEMM waits for its thread
// (bench/ckpt_stall.sh, training on both of 2 cores, the save without its disk writes: 240, 225,
// 269 ms of stall without the yields, 56, 52, 36 ms with them, builds alternated in one run).
inline thread_local bool t_background = false;

// Makes the calling thread a background thread; 0, or the errno when the system refuses the
// priority (the thread then still yields between pieces).
inline int set_background_priority() {
  t_background = true;
  sched_param p{};
  p.sched_priority = 0;
  return pthread_setschedparam(pthread_self(), SCHED_IDLE, &p);
}

inline void yield_if_background() {
  if (t_background) sched_yield();
}

}  // namespace lm
