// Checkpoint integrity (a flipped byte in any file is caught) and the async writer as a user feels
// it: paced over the interval, raised to normal priority while the step waits for it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sched.h>
#include <sys/types.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "tests/testutil.h"
#include "trainer/checkpoint/checkpoint.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/parallel.h"
#include "trainer/checkpoint/state.h"
#include "trainer/checkpoint/interval.h"
#include "trainer/checkpoint/stall.h"
#include "trainer/checkpoint/staging.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/ema.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include "tests/trainer/checkpoint/checkpoint_util.h"

namespace lm {
namespace {

using test::make_state;
using test::names;
using test::thread_named;

TEST(Checkpoint, AFlippedByteInAnyFileIsCaught) {
  test::TempDir run;
  CheckpointConfig cfg;
  Checkpointer ck(cfg, run.path(), 0, 1);
  auto st = make_state(1, 1.0f);
  st.replicated["ema"].tensors = {{"w", torch::ones({4, 4})}};
  ck.save(st);
  const std::string dir = run / "checkpoints/step_00000001";
  for (const auto& name : names(dir)) {
    if (name == "manifest.json") continue;
    const std::string path = dir + "/" + name;
    const std::string orig = test::read_text(path);
    std::string bad = orig;
    bad[bad.size() / 2] ^= 0x01;
    test::write_text(path, bad);
    EXPECT_EQ(CheckpointReader::verify(dir), path + ": checksum mismatch") << name;
    try {
      ck.load(dir);
      ADD_FAILURE() << "load accepted a flipped byte in " << name;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    test::write_text(path, orig);
    EXPECT_EQ(CheckpointReader::verify(dir), "") << name;
  }
  EXPECT_EQ(names(dir).size(), 6u);  // model, optimizer, ema, state, rank_0, manifest
}

// Pacing (writer.h): an async save's disk writes are spread over checkpoint.write_pace of the
// interval (in step time) instead of written as fast as the disk takes them; the save still
// completes within the interval, and a save due while the previous one is still writing hurries it
// (the previous one finishes at full speed and is committed first, as without pacing).
// The file system takes direct I/O here whatever the disk (so the writer writes in 8 MB pieces, as
// on a real disk), records the time of each write of 1 MB or more, and skips the fsyncs (the
// order of the writes is what is checked here, not durability: a busy disk's fsync would make the
// unpaced writes as slow as the pace).
class PaceRecordingFs : public files::FileSystem {
 public:
  int set_direct(int, bool) override { return 0; }  // accepted; the kernel still buffers the writes
  int sync(int) override { return 0; }
  int sync_dir(const char*) override { return 0; }
  int write(int fd, const void* data, size_t n, size_t* written) override {
    if (n >= (size_t{1} << 20)) {
      std::lock_guard<std::mutex> lock(mu);
      times.push_back(std::chrono::steady_clock::now());
    }
    return FileSystem::write(fd, data, n, written);
  }
  std::mutex mu;
  std::vector<std::chrono::steady_clock::time_point> times;
};

TEST(Checkpoint, AsyncWritesArePacedOverTheInterval) {
  using Clock = std::chrono::steady_clock;
  auto secs = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  test::TempDir run;
  PaceRecordingFs fs;
  files::set_file_system(&fs);
  struct Restore {
    ~Restore() { files::set_file_system(nullptr); }
  } restore;
  CheckpointConfig cfg;
  cfg.async = true, cfg.every_steps = 20, cfg.write_pace = 0.5;
  Checkpointer ck(cfg, run.path(), 0, 1);
  auto state = [](int64_t step) {  // 64 MB of tensors: 8 writes of 8 MB
    CheckpointState st;
    st.step = step;
    st.replicated["model"].tensors = {{"w", torch::full({int64_t{16} << 20}, static_cast<float>(step))}};
    st.per_rank["loader"].values = {{"cursor", step}};
    return st;
  };
  // 0.5 s a step: the interval is 10 s, the writes spread over half of it (long against the
  // writes' own time, which on a busy machine can reach a second).
  for (int64_t s = 1; s <= 3; ++s) ck.due(s, 0.5);
  EXPECT_NEAR(ck.pace_target_s(), 5.0, 1e-9);
  // One save and the steps it overlaps (0.5 s each, simulated); its report, and seconds to done.
  auto save = [&](int64_t step, double* seconds) {
    {
      std::lock_guard<std::mutex> lock(fs.mu);
      fs.times.clear();
    }
    const auto t0 = Clock::now();
    ck.save(state(step));
    std::vector<SaveReport> r;
    for (int i = 0; i < 6000 && (r = ck.finished()).empty(); ++i) {  // up to a minute or more
      ck.wait_snapshot();  // as the optimizer does before each update
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ck.step_done(0.5);
    }
    *seconds = secs(Clock::now() - t0);
    EXPECT_EQ(r.size(), 1u);
    return r.empty() ? SaveReport{} : r[0];
  };
  double s1 = 0, s2 = 0;
  const SaveReport first = save(1, &s1);  // learns how long the writes take unpaced
  EXPECT_TRUE(first.error.empty()) << first.error;
  const SaveReport second = save(2, &s2);
  EXPECT_TRUE(second.error.empty()) << second.error;
  EXPECT_NEAR(second.pace_ms, 5000.0, 1e-6);
  std::vector<Clock::time_point> times;
  {
    std::lock_guard<std::mutex> lock(fs.mu);
    times = fs.times;
  }
  ASSERT_GE(times.size(), 8u);
  // Spaced: unpaced, 64 MB into the page cache takes tens of ms (a second or two on a busy machine).
  EXPECT_GE(secs(times.back() - times.front()), 2.5) << "writes not spread over the 5 s target";
  EXPECT_GT(second.slept_ms, 0.0);
  // Within the interval: the 5 s pace plus the writes' own time after the last sleep (64 MB of
  // checksums and page-cache writes: tens of ms on an idle machine, a second at most at normal
  // priority beside busy processes): 10 s is 5x that margin. (At idle priority beside two busy
  // processes it took 32.8 s.)
  EXPECT_LE(s2, 10.0) << "the paced save did not complete within the 10 s interval";
  std::cout << "paced save: writes spread over " << secs(times.back() - times.front()) << " s, done in " << s2
            << " s, slept " << second.slept_ms << " ms (the first save: " << s1 << " s, slept " << first.slept_ms
            << " ms, writing " << first.write_ms << " ms)" << std::endl;
  for (size_t i = 1; i < times.size(); ++i) std::cout << " " << secs(times[i] - times[i - 1]);
  std::cout << std::endl;
  EXPECT_EQ(CheckpointReader::verify(run / "checkpoints/step_00000002"), "");
  // A save due before the previous one finished: the previous is hurried (its remaining pace
  // dropped) and committed first, the new one then saved as usual. Steps of 1 s now: the writes
  // are to be spread over 10 s, which the next save must not wait for.
  for (int i = 0; i < 200; ++i) ck.due(4, 1.0);
  EXPECT_NEAR(ck.pace_target_s(), 10.0, 0.01);
  const auto t0 = Clock::now();
  ck.save(state(3));
  ck.wait_snapshot();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the writer is pacing
  ck.save(state(4));
  const double call_s = secs(Clock::now() - t0);
  ck.wait();
  const auto r = ck.finished();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_NEAR(r[0].pace_ms, 10000.0, 10.0);
  // Hurried, judged by what the writer did, not by the wall clock: kept to its pace it would have
  // slept until 63/64 of the 10 s (9.8 s less its writes' own time); hurried, it slept only until
  // the next save came (0.1 s after the copy; the first of its 64 pieces is due at 0.16 s).
  EXPECT_LT(r[0].slept_ms, 0.5 * r[0].pace_ms) << "the in-flight save kept its pace while the next save waited for it";
  std::cout << "hurried save: the next save() returned after " << call_s << " s, the hurried one slept "
            << r[0].slept_ms << " ms of its " << r[0].pace_ms << " ms pace" << std::endl;
  EXPECT_EQ(r[0].step, 3);
  EXPECT_EQ(r[1].step, 4);
  for (auto& rep : r) EXPECT_TRUE(rep.error.empty()) << rep.error;
  EXPECT_EQ(CheckpointReader::verify(run / "checkpoints/step_00000003"), "");
  EXPECT_EQ(CheckpointReader::verify(run / "checkpoints/step_00000004"), "");
  EXPECT_EQ(ck.load(run / "checkpoints/step_00000004").replicated["model"].all_tensors()[0].second[7].item<float>(), 4.0f);
}


// No priority inversion (common/parallel.h, writer.cpp InFlight): the staging buffer's
// prefault and the writer's copy run at idle priority, and whoever waits for them raises them
// first. Here threads at normal priority spin on every core, as ordinary busy processes would
// (other ranks, a neighbour's job): a thread left at idle priority then gets a core for a few ms a
// second or less, and a waiter would wait minutes for 128 MB of work. Each waiter (a save joining
// the prefault, wait_snapshot(), wait()) runs on a thread of its own while this one samples the
// waited-for thread's scheduling policy: from 1 s after the waiter started (its raise is the
// first thing it does; 1 s is ample for a thread at normal priority among the spinners to be
// scheduled) the thread must not be seen at idle priority, and the wait must end within 30 s while
// the spinners still spin (raised, the work takes about a second beside them and two busy
// processes).
class Spinners {
 public:
  explicit Spinners(unsigned n) {
    for (unsigned i = 0; i < n; ++i)
      threads_.emplace_back([this] {
        volatile uint64_t x = 0;
        while (!stop_.load(std::memory_order_relaxed)) x = x + 1;
      });
  }
  ~Spinners() { stop(); }
  void stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

// Polls up to limit_s for the thread named `comm` to be at idle priority: true once seen.
bool seen_idle(const std::string& comm, double limit_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < limit_s) {
    if (pid_t tid = thread_named(comm); tid && sched_getscheduler(tid) == SCHED_IDLE) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return false;
}

struct Watched {
  double wait_s = -1;      // how long `wait` took (-1: not within the limit)
  int idle_late = 0;       // samples at idle priority 1 s or more after the waiter started
  int samples_late = 0;    // samples of the thread, alive, 1 s or more after the waiter started
};

// Runs `wait` on a thread of its own, sampling the policy of the thread named `comm` every 2 ms
// until it returned; past limit_s the spinners are stopped (so that it returns).
Watched watch_wait(const std::string& comm, const std::function<void()>& wait, Spinners* spin, double limit_s) {
  Watched w;
  const pid_t tid = thread_named(comm);
  std::atomic<bool> done{false};
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  std::thread waiter([&] {
    wait();
    w.wait_s = since();
    done = true;
  });
  while (!done.load()) {
    if (since() > limit_s) {
      spin->stop();
      break;
    }
    const int policy = tid ? sched_getscheduler(tid) : -1;
    if (policy >= 0 && since() >= 1.0) {
      ++w.samples_late;
      w.idle_late += policy == SCHED_IDLE;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  waiter.join();
  if (w.wait_s > limit_s) w.wait_s = -1;
  return w;
}

TEST(Checkpoint, AsyncWriterIsRaisedWhenWaitedFor) {
  const bool idle = can_leave_idle_priority();  // else nothing is ever lowered (parallel.h)
  if (!idle) std::cout << "this process cannot leave idle priority: the writer works at normal priority" << std::endl;
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.async = true;
  Checkpointer ck(cfg, run.path(), 0, 1);
  auto st = make_state(1, 1.0f);
  const auto big = torch::arange(32 << 20, torch::kFloat);  // 128 MB
  st.replicated["optimizer"].tensors.emplace_back("exp_avg_sq/big", big);
  Spinners spin(std::max(2u, std::thread::hardware_concurrency()));
  auto check = [&](const char* what, const char* comm, const Watched& w) {
    EXPECT_EQ(w.idle_late, 0) << what << ": " << comm << " still at idle priority 1 s and more into the wait ("
                              << w.idle_late << " of " << w.samples_late << " samples)";
    EXPECT_GE(w.wait_s, 0) << what << " did not return within 30 s while the cores were busy";
    std::cout << what << ": " << w.wait_s << " s beside the spinners, " << comm << " sampled " << w.samples_late
              << " times after 1 s, " << w.idle_late << " at idle priority" << std::endl;
  };
  ck.prepare(st);
  if (idle) {
    EXPECT_TRUE(seen_idle("ckpt-prefault", 10)) << "the prefault at idle priority";
  }
  check("the first save() (joins the prefault)", "ckpt-prefault", watch_wait("ckpt-prefault", [&] { ck.save(st); }, &spin, 30));
  if (idle) {
    EXPECT_TRUE(seen_idle("ckpt-writer", 10)) << "the writer's copy at idle priority";
  }
  check("wait_snapshot()", "ckpt-writer", watch_wait("ckpt-writer", [&] { ck.wait_snapshot(); }, &spin, 30));
  check("the second save() (waits for the first)", "ckpt-writer",
        watch_wait("ckpt-writer", [&] { st.step = 2; ck.save(st); }, &spin, 30));
  if (idle) {
    EXPECT_TRUE(seen_idle("ckpt-writer", 10)) << "the writer's copy at idle priority";
  }
  check("wait()", "ckpt-writer", watch_wait("ckpt-writer", [&] { ck.wait(); }, &spin, 30));
  spin.stop();
  ck.wait();
  const auto r = ck.finished();
  ASSERT_EQ(r.size(), 2u);
  for (auto& rep : r) EXPECT_TRUE(rep.error.empty()) << rep.error;
  EXPECT_TRUE(torch::equal(ck.load(run / "checkpoints/step_00000002").replicated["optimizer"].all_tensors()[1].second, big));
}

}  // namespace
}  // namespace lm