// A disk that fills up, tried as a user would: the run directory on a small tmpfs (mounted in a
// private mount namespace by unshare, so nothing outlives the test). The trainer must stop with one
// line naming the path and the error (exit 1) or, with checkpoint.on_error: continue, keep
// training and save again at the next interval; every checkpoint committed before still verifies
// and resumes, and nothing half-written looks complete.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <sstream>

#include "tests/testutil.h"
#include "trainer/checkpoint/reader.h"
#include "run/run_dir.h"
#include "trainer/telemetry/tensorboard.h"

namespace lm {
namespace {

namespace stdfs = std::filesystem;
using test::TempDir;

constexpr int kNoTmpfs = 97;  // the script's exit code when no tmpfs could be mounted

// Runs the sh `script` with a fresh tmpfs of size_kb mounted at `mnt` (a private mount namespace:
// unshare -m as root, else a user namespace). The tmpfs vanishes with the script: copy results out.
test::RunResult in_tmpfs(int size_kb, const std::string& mnt, const std::string& script) {
  const std::string mount = "mount -t tmpfs -o size=" + std::to_string(size_kb) + "k tmpfs '" + mnt + "' || exit " +
                            std::to_string(kNoTmpfs) + "\n";
  return test::run_bin("/usr/bin/unshare", {::geteuid() == 0 ? "-m" : "-rm", "sh", "-c", mount + script});
}

std::string quoted_args(const std::vector<std::string>& args) {
  std::string s;
  for (auto& a : args) s += " '" + a + "'";
  return s;
}

std::vector<std::string> train_args(const std::vector<std::string>& extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                                "model.d_model=32", "model.seq_len=32", "train.micro_batch_size=4", "eval.batches=0",
                                "train.threads=1", "log.every_steps=1", "checkpoint.keep_last=0"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// What a full disk may leave: committed checkpoints that verify, no unfinished checkpoint, and
// only complete records in metrics.jsonl and the TensorBoard files.
void expect_nothing_half_written(const std::string& run) {
  int committed = 0;
  for (auto& e : stdfs::directory_iterator(run_dir::checkpoints(run))) {
    const std::string name = e.path().filename().string();
    EXPECT_EQ(name.find(".tmp"), std::string::npos) << "an unfinished checkpoint was left: " << name;
    if (run_dir::parse_step_name(name) < 0) continue;
    EXPECT_EQ(CheckpointReader::verify(e.path().string()), "") << name;
    ++committed;
  }
  EXPECT_GE(committed, 1);
  std::istringstream lines(test::read_text(run_dir::metrics(run)));
  for (std::string line; std::getline(lines, line);)
    EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << "a torn line: " << line;
  for (auto& e : stdfs::directory_iterator(run)) {
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) {
      EXPECT_NO_THROW(read_tensorboard_scalars(e.path().string())) << e.path();
    }
  }
}

std::string last_line(const std::string& out) {
  std::string s = out;
  while (!s.empty() && s.back() == '\n') s.pop_back();
  return s.substr(s.rfind('\n') + 1);
}

// Checkpoints every few steps until the tmpfs is full: one line, exit 1, and the run resumes from
// its last committed checkpoint on a disk with room.
TEST(DiskFull, CheckpointsFillTheDiskThenTheRunResumes) {
  TempDir tmp;
  const std::string mnt = tmp / "mnt", out = tmp / "out";
  stdfs::create_directories(mnt);
  stdfs::create_directories(out);
  const auto args = train_args({"train.max_steps=60", "checkpoint.every_steps=3", "run.dir=" + mnt + "/run"});
  auto r = in_tmpfs(1200, mnt, "'" + test::bin_path("trainer") + "'" + quoted_args(args) + " > '" + out +
                                   "/log' 2>&1; echo $? > '" + out + "/rc'; cp -a '" + mnt + "/run' '" + out + "/run'");
  if (r.exit_code == kNoTmpfs) GTEST_SKIP() << "no tmpfs can be mounted here: " << r.out;
  const std::string log = test::read_text(out + "/log");
  EXPECT_EQ(test::read_text(out + "/rc"), "1\n") << log;
  EXPECT_NE(last_line(log).find("trainer: error: "), std::string::npos) << log;
  EXPECT_NE(last_line(log).find("No space left on device"), std::string::npos) << log;
  EXPECT_EQ(log.find("terminate called"), std::string::npos) << log;
  expect_nothing_half_written(out + "/run");
  auto resumed = test::run_bin("trainer", train_args({"train.max_steps=60", "checkpoint.every_steps=3",
                                                      "run.dir=" + out + "/run"}));
  EXPECT_EQ(resumed.exit_code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("resumed from " + out + "/run/checkpoints/step_"), std::string::npos) << resumed.out;
}

// Metrics and TensorBoard fill the disk (no checkpoint due): the sink's thread hands the error
// to the training thread, which stops with one line (before: "terminate called", exit 134).
TEST(DiskFull, MetricsWriterThreadStopsCleanly) {
  TempDir tmp;
  const std::string mnt = tmp / "mnt", out = tmp / "out";
  stdfs::create_directories(mnt);
  stdfs::create_directories(out);
  const auto args = train_args({"train.max_steps=100000", "checkpoint.every_steps=0", "log.tensorboard=true",
                                "checkpoint.on_error=stop", "run.dir=" + mnt + "/run"});
  auto r = in_tmpfs(160, mnt, "'" + test::bin_path("trainer") + "'" + quoted_args(args) + " > '" + out +
                                  "/log' 2>&1; echo $? > '" + out + "/rc'; cp -a '" + mnt + "/run' '" + out + "/run'");
  if (r.exit_code == kNoTmpfs) GTEST_SKIP() << "no tmpfs can be mounted here: " << r.out;
  const std::string log = test::read_text(out + "/log");
  EXPECT_EQ(test::read_text(out + "/rc"), "1\n") << log;
  EXPECT_NE(last_line(log).find("trainer: error: metrics: " + mnt + "/run/"), std::string::npos) << log;
  EXPECT_NE(last_line(log).find("No space left on device"), std::string::npos) << log;
  EXPECT_EQ(log.find("terminate called"), std::string::npos) << log;
}

// checkpoint.on_error: continue on a disk that is full for a while: the failed save is reported,
// training goes on, and the next interval saves again once there is room. The run is open-ended and
// stopped by SIGTERM only after a committed checkpoint appeared, so a fast machine cannot finish the
// run before the filler is gone (it once did: 40 steps in 60 ms).
TEST(DiskFull, ContinueSavesAgainAtTheNextInterval) {
  TempDir tmp;
  const std::string mnt = tmp / "mnt", out = tmp / "out";
  stdfs::create_directories(mnt);
  stdfs::create_directories(out);
  const auto args = train_args({"train.max_steps=100000", "checkpoint.every_steps=5", "checkpoint.on_error=continue",
                                "checkpoint.keep_last=1", "log.tensorboard=true", "run.dir=" + mnt + "/run"});
  const std::string ckpts = run_dir::checkpoints(mnt + "/run");
  const std::string script =
      "head -c 1700k /dev/zero > '" + mnt + "/filler'\n'" + test::bin_path("trainer") + "'" + quoted_args(args) +
      " > '" + out + "/log' 2>&1 &\npid=$!\n"
      "while ! grep -q 'failed' '" + out + "/log'; do kill -0 $pid 2>/dev/null || break; sleep 0.05; done\n"
      "rm '" + mnt + "/filler'\nok=; n=0\n"
      "while [ -z \"$ok\" ] && [ $n -lt 3000 ] && kill -0 $pid 2>/dev/null; do\n  n=$((n+1))\n"
      "  for d in '" + ckpts + "'/step_*; do case \"$d\" in *.tmp|*'*') ;; *) ok=\"${d##*/}\" ;; esac; done\n"
      "  sleep 0.02\ndone\n"
      "echo \"$ok\" > '" + out + "/first_ok'\n"
      "kill -TERM $pid 2>/dev/null; wait $pid; echo $? > '" + out + "/rc'; cp -a '" + mnt + "/run' '" + out + "/run'";
  auto r = in_tmpfs(2000, mnt, script);
  if (r.exit_code == kNoTmpfs) GTEST_SKIP() << "no tmpfs can be mounted here: " << r.out;
  const std::string log = test::read_text(out + "/log");
  EXPECT_EQ(test::read_text(out + "/rc"), "0\n") << log;
  EXPECT_NE(log.find("No space left on device"), std::string::npos) << log;
  EXPECT_NE(log.find("checkpoint.on_error: continue, training goes on"), std::string::npos) << log;
  const std::string failed_at = "checkpoint at step ";
  const size_t f = log.find(failed_at);
  ASSERT_NE(f, std::string::npos) << log;
  const long long failed_step = std::stoll(log.substr(f + failed_at.size()));
  std::string first_ok = test::read_text(out + "/first_ok");
  while (!first_ok.empty() && first_ok.back() == '\n') first_ok.pop_back();
  const int64_t saved_step = run_dir::parse_step_name(first_ok);
  EXPECT_GT(saved_step, failed_step) << "first committed checkpoint: '" << first_ok << "'\n" << log;
  EXPECT_EQ(saved_step % 5, 0) << "not an interval's save: " << first_ok;
  expect_nothing_half_written(out + "/run");
}

}  // namespace
}  // namespace lm
