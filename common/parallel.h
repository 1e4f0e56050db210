// parallel_for: the one small thread pool for CPU work split into independent items (prep's
// tokenizing rounds, the raw-text index build). Background threads: idle priority until someone
// waits for them, a yield between pieces of work, and optionally a pace (Pacer: the work spread
// over a given time).
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

// Idle priority for work nobody waits for yet. The async checkpoint writer's staging copy and the
// staging buffer's prefault take only CPU time the threads of training leave: their thread runs at
// idle priority (SCHED_IDLE) and calls yield_if_background() between pieces of its work (a piece:
// about a millisecond). Idle priority alone is not enough: OpenBLAS threads waiting for their
// next GEMM spin on sched_yield(), each yield hands the CPU to the idle thread, and it would keep
// it until the next scheduler tick while the GEMM waits for its thread (bench/ckpt_stall.sh,
// training on both of 2 cores, the save without its disk writes: 240, 225, 269 ms of stall
// without the yields, 56, 52, 36 ms with them, builds alternated in one run).
//
// No priority inversion: an idle thread gets almost no CPU while ordinary processes keep the
// cores busy (other ranks, loader threads, a neighbour's job: weight 3 against 1024 each), so a
// thread that waits for its work would wait for them all. Whoever waits raises it first (raise():
// SCHED_OTHER, the process's nice) for the rest of its life; work with a deadline of its own
// (the checkpoint's paced disk writes) is never left at idle priority at all, it keeps its pace by
// sleeping (Pacer). Raising is done by the waiting thread on the idle thread's handle, not by a
// flag the idle thread would check: a thread at idle priority may not run for a second to see it.
// An unprivileged thread cannot leave SCHED_IDLE unless RLIMIT_NICE allows its nice value (20
// minus the nice; the usual limit is 0; CAP_SYS_NICE lifts it), and no waiter could raise it:
// there nothing is lowered (can_leave_idle_priority(), probed once) and the thread works at
// normal priority, still yielding between pieces.
//
// Usage: the thread calls lower() first; a waiter calls raise(handle) before it blocks.
class IdlePriority {
 public:
  // On the thread itself: idle priority, unless a raise() came first or the process could not
  // raise it again. Returns whether it is at idle priority now.
  bool lower();
  // From any thread, `thread` being the one that called (or will call) lower(): normal priority
  // from now on (also for a lower() still to come). 0 or the errno.
  int raise(pthread_t thread);
  bool raised() const { return raised_.load(); }

 private:
  std::atomic<bool> raised_{false};
};

// The IdlePriority of the calling thread's work, if any: yield_if_background() yields while it is
// not raised.
inline thread_local IdlePriority* t_background = nullptr;

inline int set_policy(pthread_t thread, int policy) {
  sched_param p{};
  p.sched_priority = 0;
  return pthread_setschedparam(thread, policy, &p);
}

// Whether this process may move a thread from idle priority back to normal (see above). Probed
// once, on a thread of its own.
inline bool can_leave_idle_priority() {
  static const bool can = [] {
    bool ok = false;
    std::thread t([&ok] { ok = set_policy(pthread_self(), SCHED_IDLE) == 0 && set_policy(pthread_self(), SCHED_OTHER) == 0; });
    t.join();
    return ok;
  }();
  return can;
}

inline bool IdlePriority::lower() {
  if (raised_.load() || !can_leave_idle_priority()) return false;
  if (set_policy(pthread_self(), SCHED_IDLE) != 0) return false;
  // A raise() between the check above and the change: its own change may have come first.
  if (raised_.load()) {
    set_policy(pthread_self(), SCHED_OTHER);
    return false;
  }
  return true;
}

inline int IdlePriority::raise(pthread_t thread) {
  raised_.store(true);  // before the change: a lower() after it sees the flag (lower() above)
  return set_policy(thread, SCHED_OTHER);
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
  if (t_background && !t_background->raised()) sched_yield();
}

}  // namespace lm
