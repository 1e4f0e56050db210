// SIGTERM / SIGINT at every phase of a real trainer process (trainer/runtime/stop_signal.h): start-up,
// rendezvous and resume loading end at once with one line and 128+signal, wherever they block;
// evaluation, a checkpoint write and shutdown end cleanly (exit 0, a checkpoint when training had
// started); a second signal aborts at once. The phase is pinned without timing guesses: a FIFO the
// trainer blocks on (start-up, resume), a missing rank (rendezvous), a long evaluation, and inotify
// + SIGSTOP on the file a checkpoint or the shutdown is writing.
#include <fcntl.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <thread>

#include "tests/testutil.h"

namespace lm {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using Clock = std::chrono::steady_clock;

std::vector<std::string> trainer_args(const std::string& data, const std::string& run,
                                      const std::vector<std::string>& extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + data, "run.dir=" + run,
                                "model.d_model=32", "model.seq_len=32", "train.micro_batch_size=4",
                                "log.every_steps=1", "log.tensorboard=false", "train.threads=1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

struct Trainer {
  Process p;
  std::string out;
};
Trainer start(const std::vector<std::string>& args, const std::string& out,
              const std::vector<std::pair<std::string, std::string>>& env = {}) {
  SpawnOptions o;
  o.argv = {test::bin_path("trainer")};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.out = Redirect::file(out, false);
  o.err = Redirect::to_stdout();
  o.set_env("OMP_NUM_THREADS", "1");
  for (auto& [k, v] : env) o.set_env(k, v);
  return {Process::spawn(o), out};
}

// The wait status, or -1 when it did not exit within timeout_s (then it is SIGKILLed).
int wait_status(Trainer& t, double timeout_s) {
  auto st = t.p.wait_for(timeout_s);
  if (st) return *st;
  t.p.signal(SIGKILL);
  t.p.wait();
  return -1;
}

// Blocks until someone has `fifo` open for reading (the trainer is blocked on it); returns the
// write end, kept open (and silent) so that the reader stays blocked in read().
int wait_for_reader(const std::string& fifo, const Process& p) {
  for (auto t0 = Clock::now(); Clock::now() - t0 < std::chrono::seconds(120) && p.running();) {
    int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) return fd;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

// A start-up stop: exit status 128+sig within a few seconds, the one line, no checkpoint.
void expect_startup_exit(Trainer& t, int sig, const std::string& run) {
  const auto t0 = Clock::now();
  ASSERT_TRUE(t.p.signal(sig));
  const int st = wait_status(t, 10);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string out = test::read_text(t.out);
  ASSERT_NE(st, -1) << "no exit 10 s after " << strsignal(sig) << ":\n" << out;
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 128 + sig) << exit_text(st) << "\n" << out;
  EXPECT_LT(s, 5.0);
  const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
  EXPECT_NE(out.find("trainer: stopped by " + name + " during start-up (nothing to save yet)"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(run + "/meta.json"));
}

class SignalTest : public ::testing::Test {
 protected:
  const std::string& data_ = test::shared_bytes_dataset();
};

TEST_F(SignalTest, StartUpBlockedOnDataExitsAtOnce) {
  for (int sig : {SIGTERM, SIGINT}) {
    TempDir d;
    fs::create_directories(d / "data");
    const std::string fifo = d / "data/manifest.json";
    ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
    auto t = start(trainer_args(d / "data", d / "run", {}), d / "out");
    const int w = wait_for_reader(fifo, t.p);
    ASSERT_GE(w, 0) << test::read_text(t.out);
    expect_startup_exit(t, sig, d / "run");
    ::close(w);
  }
}

TEST_F(SignalTest, RendezvousWaitingForAMissingRankExitsAtOnce) {
  TempDir d;
  auto t = start(trainer_args(data_, d / "run", {"dist.backend=gloo"}), d / "out",
                 {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"},
                  {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", std::to_string(test::free_port())}});
  for (auto t0 = Clock::now(); test::read_text(t.out).find("rendezvous") == std::string::npos;) {
    ASSERT_TRUE(t.p.running()) << test::read_text(t.out);
    ASSERT_LT(Clock::now() - t0, std::chrono::seconds(120));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // inside the store's wait
  expect_startup_exit(t, SIGTERM, d / "run");
}

TEST_F(SignalTest, ResumeLoadingBlockedOnACheckpointExitsAtOnce) {
  TempDir d;
  const auto args = trainer_args(data_, d / "run", {"train.max_steps=4", "checkpoint.every_steps=2"});
  auto first = start(args, d / "out1");
  ASSERT_EQ(wait_status(first, 300), 0) << test::read_text(first.out);
  const std::string manifest = d / "run/checkpoints/step_00000004/manifest.json";
  ASSERT_TRUE(fs::exists(manifest));
  fs::remove(manifest);
  ASSERT_EQ(::mkfifo(manifest.c_str(), 0644), 0);
  fs::remove(d / "run/meta.json");
  auto t = start(args, d / "out2");
  const int w = wait_for_reader(manifest, t.p);
  ASSERT_GE(w, 0) << test::read_text(t.out);
  expect_startup_exit(t, SIGTERM, d / "run");
  ::close(w);
}

std::string meta_status(const std::string& run) {
  return nlohmann::json::parse(test::read_text(run + "/meta.json")).value("status", "");
}

TEST_F(SignalTest, DuringEvaluationTheRunCheckpointsAfterItAndResumes) {
  TempDir d;
  const auto args = trainer_args(data_, d / "run", {"train.max_steps=6", "eval.every_steps=2", "eval.batches=5000"});
  auto t = start(args, d / "out");
  // Step 2's record is written before its evaluation starts; 400 batches keep it busy.
  for (auto t0 = Clock::now(); test::last_train_step(d / "run/metrics.jsonl") < 2;) {
    ASSERT_TRUE(t.p.running()) << test::read_text(t.out);
    ASSERT_LT(Clock::now() - t0, std::chrono::seconds(120));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(t.p.signal(SIGTERM));
  const int st = wait_status(t, 300);
  const std::string out = test::read_text(t.out);
  ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << exit_text(st) << "\n" << out;
  EXPECT_EQ(meta_status(d / "run"), "stopped");
  EXPECT_EQ(test::metrics_of_kind(d / "run/metrics.jsonl", "val").size(), 1u) << "the evaluation finished";
  EXPECT_TRUE(fs::exists(d / "run/checkpoints/step_00000003/manifest.json")) << out;
  auto again = start(args, d / "out2");
  ASSERT_EQ(wait_status(again, 300), 0) << test::read_text(again.out);
  EXPECT_NE(test::read_text(again.out).find("at step 3"), std::string::npos) << test::read_text(again.out);
  EXPECT_EQ(test::last_train_step(d / "run/metrics.jsonl"), 6);
}

// Runs `args` and SIGSTOPs the trainer as soon as a file or directory whose name starts with
// `prefix` appears in `dir` (created or renamed in), while it still exists: the trainer is frozen
// in the middle of writing it. True when caught; the trainer is left stopped.
bool freeze_while_writing(Trainer& t, const std::string& dir, const std::string& prefix) {
  fs::create_directories(dir);
  int in = ::inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (in < 0 || ::inotify_add_watch(in, dir.c_str(), IN_CREATE | IN_MOVED_TO) < 0) return false;
  alignas(inotify_event) char buf[8192];
  bool caught = false;
  for (auto t0 = Clock::now(); !caught && t.p.running() && Clock::now() - t0 < std::chrono::seconds(240);) {
    ssize_t n = ::read(in, buf, sizeof buf);
    if (n <= 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    for (char* p = buf; p < buf + n && !caught;) {
      auto* e = reinterpret_cast<inotify_event*>(p);
      const std::string name = e->len ? e->name : "";
      if (name.rfind(prefix, 0) == 0) {
        t.p.signal(SIGSTOP);
        if (fs::exists(dir + "/" + name)) caught = true;
        else t.p.signal(SIGCONT);
      }
      p += sizeof(inotify_event) + e->len;
    }
  }
  ::close(in);
  return caught;
}

TEST_F(SignalTest, DuringACheckpointWriteTheSaveFinishesAndTheRunStops) {
  TempDir d;
  const auto args = trainer_args(data_, d / "run", {"train.max_steps=40", "checkpoint.every_steps=1",
                                                    "model.d_model=128", "checkpoint.keep_last=0"});
  auto t = start(args, d / "out");
  ASSERT_TRUE(freeze_while_writing(t, d / "run/checkpoints", "step_")) << test::read_text(t.out);
  std::string writing;
  for (auto& e : fs::directory_iterator(d / "run/checkpoints"))
    if (e.path().extension() == ".tmp") writing = e.path().filename().string();
  t.p.signal(SIGTERM);
  t.p.signal(SIGCONT);
  const int st = wait_status(t, 300);
  const std::string out = test::read_text(t.out);
  ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << exit_text(st) << "\n" << out;
  EXPECT_EQ(meta_status(d / "run"), "stopped");
  if (!writing.empty()) {  // the save that was in progress was committed, not abandoned
    EXPECT_TRUE(fs::exists(d / ("run/checkpoints/" + writing.substr(0, writing.size() - 4) + "/manifest.json"))) << writing;
  }
  for (auto& e : fs::directory_iterator(d / "run/checkpoints"))
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  auto again = start(args, d / "out2");
  ASSERT_EQ(wait_status(again, 300), 0) << test::read_text(again.out);
  EXPECT_EQ(test::read_text(again.out).find("skipping checkpoint"), std::string::npos) << test::read_text(again.out);
  EXPECT_EQ(test::last_train_step(d / "run/metrics.jsonl"), 40);
}

TEST_F(SignalTest, DuringShutdownTheRunCompletes) {
  TempDir d;
  // A model of ~13 MB, so that SIGSTOP lands while the weights are written even on a loaded machine
  // (the tests' tiny one was written and renamed before it, now and then).
  const auto args = trainer_args(data_, d / "run", {"train.max_steps=6", "model.d_model=256", "model.n_head=4",
                                                    "model.n_layer=4"});
  auto t = start(args, d / "out");
  ASSERT_TRUE(freeze_while_writing(t, d / "run", "model.safetensors.tmp")) << test::read_text(t.out);
  t.p.signal(SIGTERM);
  t.p.signal(SIGCONT);
  const int st = wait_status(t, 120);
  const std::string out = test::read_text(t.out);
  ASSERT_TRUE(st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0) << exit_text(st) << "\n" << out;
  EXPECT_EQ(meta_status(d / "run"), "completed");
  EXPECT_TRUE(fs::exists(d / "run/model.safetensors"));
  EXPECT_TRUE(fs::exists(d / "run/checkpoints/step_00000006/manifest.json"));
}

TEST_F(SignalTest, ASecondSignalAbortsAtOnce) {
  TempDir d;
  auto t = start(trainer_args(data_, d / "run", {"train.max_steps=6", "eval.every_steps=2", "eval.batches=5000"}), d / "out");
  for (auto t0 = Clock::now(); test::last_train_step(d / "run/metrics.jsonl") < 2;) {
    ASSERT_TRUE(t.p.running()) << test::read_text(t.out);
    ASSERT_LT(Clock::now() - t0, std::chrono::seconds(120));
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(t.p.signal(SIGTERM));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(t.p.running()) << "the first signal waits for the evaluation to finish";
  const auto t0 = Clock::now();
  ASSERT_TRUE(t.p.signal(SIGINT));
  const int st = wait_status(t, 10);
  ASSERT_NE(st, -1) << test::read_text(t.out);
  EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGINT) << exit_text(st);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 5.0);
}

}  // namespace
}  // namespace lm
