// parallel_for: the one small thread pool for CPU work split into independent items (prep's
// tokenizing rounds, the raw-text index build). Background threads: idle priority, a yield between
// pieces of work, and optionally a pace (Pacer: the work spread over a given time).
#pragma once

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
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

// Spreads a background thread's work over a target time instead of doing it as fast as possible
// (the async checkpoint writer's disk writes over a share of the checkpoint interval: on a VM the
// host's side of each write takes CPU from training, and a burst of 1.5 GB takes it from every
// step it overlaps). The thread works in pieces (between the yields above: the writer's are its
// checksum's 1 MB pieces, each just before the piece is written); after its k-th piece of an
// expected n it sleeps until k/n of the target time has passed since start(). Late pieces do not
// sleep (the schedule is absolute: a piece that took long is made up by sleeping less), and past
// the n-th piece nothing sleeps, so the work ends at the target time, or as soon as it can when it
// takes longer. hurry() (any thread: someone waits for the work) ends the sleeping at once. A
// thread paces itself with it by setting t_pacer.
class Pacer {
 public:
  using Clock = std::chrono::steady_clock;
  // pieces: the expected number of pieces; target_s: the time to spread them over (<= 0: no
  // sleeps).
  void start(double pieces, double target_s) {
    std::lock_guard<std::mutex> lock(mu_);
    pieces_ = pieces, target_s_ = target_s, done_ = 0, slept_s_ = 0;
    start_ = Clock::now();
  }
  // After a piece of work (the pacing thread): sleeps until the schedule, unless hurried.
  void piece_done() {
    std::unique_lock<std::mutex> lock(mu_);
    ++done_;
    if (hurried_ || target_s_ <= 0 || pieces_ <= 0 || done_ >= pieces_) return;
    const double due_s = target_s_ * static_cast<double>(done_) / pieces_;
    const auto until = start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(due_s));
    const auto now = Clock::now();
    if (until <= now) return;
    cv_.wait_until(lock, until, [this] { return hurried_; });
    slept_s_ += std::chrono::duration<double>(Clock::now() - now).count();
  }
  // From any thread: no more sleeps (and the one in progress ends).
  void hurry() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      hurried_ = true;
    }
    cv_.notify_all();
  }
  double slept_s() {  // time slept since start()
    std::lock_guard<std::mutex> lock(mu_);
    return slept_s_;
  }
  double pieces_done() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<double>(done_);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool hurried_ = false;  // never reset: a hurry before start() holds too
  double pieces_ = 0, target_s_ = 0, slept_s_ = 0;
  uint64_t done_ = 0;
  Clock::time_point start_{};
};

// The calling thread's Pacer, or null (unpaced): yield_if_background() paces it.
inline thread_local Pacer* t_pacer = nullptr;

inline void yield_if_background() {
  if (t_pacer) t_pacer->piece_done();
  if (t_background) sched_yield();
}

}  // namespace lm
