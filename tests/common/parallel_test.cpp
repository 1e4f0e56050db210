// Background threads' priority (common/parallel.h, IdlePriority): idle for the thread that lowers
// itself only, raised by a waiter from another thread, and a raise that comes first holds.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "common/parallel.h"

namespace lm {
namespace {

// Runs `body` on a thread of its own and returns its scheduling policy right after.
template <class F>
int policy_after(F body) {
  int policy = -1;
  std::thread t([&] {
    body();
    policy = sched_getscheduler(0);
  });
  t.join();
  return policy;
}

TEST(Parallel, IdlePriorityIsForItsThreadOnlyAndRaisedByAWaiter) {
  if (!can_leave_idle_priority()) GTEST_SKIP() << "this process cannot leave idle priority: nothing is lowered";
  const int before = sched_getscheduler(0);
  // Lowered: idle, for that thread only.
  IdlePriority a;
  EXPECT_EQ(policy_after([&] { EXPECT_TRUE(a.lower()); }), SCHED_IDLE);
  EXPECT_EQ(sched_getscheduler(0), before);
  EXPECT_FALSE(a.raised());
  // A waiter raises it from another thread, on its handle: normal priority, and it stays there.
  IdlePriority b;
  std::atomic<int> stage{0}, seen{-1};
  std::thread t([&] {
    t_background = &b;
    EXPECT_TRUE(b.lower());
    stage = 1;
    while (stage.load() != 2) std::this_thread::yield();
    seen = sched_getscheduler(0);
    EXPECT_FALSE(b.lower()) << "lowered again after a raise";
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);
    t_background = nullptr;
  });
  while (stage.load() != 1) std::this_thread::yield();
  EXPECT_EQ(b.raise(t.native_handle()), 0);
  stage = 2;
  t.join();
  EXPECT_EQ(seen.load(), SCHED_OTHER);
  EXPECT_TRUE(b.raised());
  // Raised before it lowered itself (a waiter that came first): it never goes idle.
  IdlePriority c;
  c.raise(pthread_self());
  EXPECT_EQ(policy_after([&] { EXPECT_FALSE(c.lower()); }), SCHED_OTHER);
  EXPECT_EQ(t_background, nullptr);  // this thread is not a background thread
}

// The Pacer: k/n of the target time after the k-th piece; hurry() ends the sleeping.
TEST(Parallel, PacerSleepsToItsScheduleUntilHurried) {
  Pacer p;
  p.start(4, 0.4);
  const auto t0 = std::chrono::steady_clock::now();
  p.piece_done();  // sleeps until 0.1 s
  p.piece_done();  // until 0.2 s
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.2);  // a lower bound: sleeps end no earlier than due, whatever the load
  EXPECT_GT(p.slept_s(), 0.0);
  p.hurry();
  const double slept = p.slept_s();
  p.piece_done();
  p.piece_done();
  EXPECT_EQ(p.slept_s(), slept);  // hurried: no more sleeps
  EXPECT_EQ(p.pieces_done(), 4.0);
}

}  // namespace
}  // namespace lm
