// Data parallelism with real processes in real Gloo groups: 2 ranks x micro-batch B equal 1 rank x
// 2B; a dead or hung peer makes the survivor exit naming the collective; real torchrun and Slurm's
// variables start the same trainer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "tests/testutil.h"
#include "tests/trainer/parallel/group_run.h"
#include "trainer/checkpoint/safetensors.h"

namespace lm {
namespace {

using test::TempDir;

class DistE2E : public ::testing::Test {
 protected:
  const std::string data_ = test::shared_bytes_dataset();
};

std::vector<std::string> args(const std::string& data, const std::string& run, std::vector<std::string> extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + data, "run.dir=" + run,
                                "log.every_steps=1", "eval.batches=0", "train.threads=1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<double> train_losses(const std::string& run) {
  std::vector<double> out;
  for (auto& l : test::metrics_of_kind(run + "/metrics.jsonl", "train")) out.push_back(nlohmann::json::parse(l)["loss"]);
  return out;
}

// dist.backend named at world size 1: the process group, the bucketed all-reduce and the step
// statistics run over one rank (what bench/gpu.sh does with NCCL on one GPU), with the same losses
// and weights as a run without a group.
TEST_F(DistE2E, OneRankWithANamedBackendRunsTheGroupAndMatches) {
  TempDir plain, group;
  auto p = test::spawn_bin("trainer", args(data_, plain.path(), {"train.max_steps=6"}), plain / "out", {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(test::wait_proc(p), 0) << test::read_text(plain / "out");
  auto q = test::spawn_bin("trainer", args(data_, group.path(), {"train.max_steps=6", "dist.backend=gloo"}), group / "out",
                           {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(test::wait_proc(q), 0) << test::read_text(group / "out");
  EXPECT_EQ(test::read_text(plain / "out").find("data parallel"), std::string::npos);
  EXPECT_NE(test::read_text(group / "out").find("data parallel: gloo"), std::string::npos) << test::read_text(group / "out");
  EXPECT_EQ(train_losses(plain.path()), train_losses(group.path()));
  EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(group / "model.safetensors"));
}

TEST_F(DistE2E, TwoRanksOfBEqualOneRankOf2B) {
  TempDir one, two;
  auto p = test::spawn_bin("trainer", args(data_, one.path(), {"train.max_steps=12", "train.micro_batch_size=8"}),
                           one / "out", {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(test::wait_proc(p), 0) << test::read_text(one / "out");
  const int port = test::free_port();
  std::vector<test::Proc> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(test::spawn_bin("trainer", args(data_, two.path(), {"train.max_steps=12", "train.micro_batch_size=4",
                                                                        "dist.bucket_mb=0.05"}),
                                    two / ("out" + std::to_string(r)), test::rank_env(r, 2, port)));
  for (auto& r : ranks) ASSERT_EQ(test::wait_proc(r), 0) << test::read_text(two / "out0");
  EXPECT_NE(test::read_text(two / "out0").find("gradient buckets"), std::string::npos);
  auto a = train_losses(one.path()), b = train_losses(two.path());
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * std::abs(a[i])) << "step " << i + 1;
  auto wa = load_safetensors(one / "model.safetensors"), wb = load_safetensors(two / "model.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i)
    EXPECT_TRUE(torch::allclose(wa[i].second, wb[i].second, 1e-4, 1e-5)) << wa[i].first;
  // Every rank keeps its own log; rank 0 alone writes the run files.
  EXPECT_TRUE(test::read_text(two / "logs/rank_1.log").size() > 0);
}

// The survivor of a group whose peer died (SIGKILL) or hangs (SIGSTOP) exits with an error naming
// the collective, within the configured timeout.
void expect_survivor_names_collective(const std::string& data, int sig) {
  TempDir run;
  const int port = test::free_port();
  std::vector<test::Proc> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(test::spawn_bin("trainer", args(data, run.path(), {"train.max_steps=100000", "dist.timeout_s=6",
                                                                       "train.micro_batch_size=4"}),
                                    run / ("out" + std::to_string(r)), test::rank_env(r, 2, port)));
  ASSERT_TRUE(test::wait_until(ranks[0], [&] { return test::last_train_step(run / "metrics.jsonl") >= 3; }))
      << test::read_text(run / "out0");
  const auto t0 = std::chrono::steady_clock::now();
  test::kill_proc(ranks[1], sig);
  const int code = test::wait_proc(ranks[0], 60);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  test::kill_proc(ranks[1], SIGKILL);
  test::wait_proc(ranks[1], 10);
  const std::string out = test::read_text(run / "out0");
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("trainer: error: collective '"), std::string::npos) << out;
  EXPECT_LT(waited, 30.0);
}

TEST_F(DistE2E, DeadPeerFailsTheCollective) { expect_survivor_names_collective(data_, SIGKILL); }
TEST_F(DistE2E, HungPeerTimesOut) { expect_survivor_names_collective(data_, SIGSTOP); }

TEST_F(DistE2E, RealTorchrunStartsTheTrainer) {
  TempDir run;
  // Debian's torch 1.13 on Python 3.11 cannot parse the default --redirects (Std.from_str("0")
  // returns None there), so stderr is redirected and teed explicitly.
  auto r = test::run_bin("/usr/bin/python3",
                         {"-m", "torch.distributed.run", "--nproc_per_node", "2", "--redirects", "2", "--tee", "2",
                          "--master_port", std::to_string(test::free_port()), "--no_python", test::bin_path("trainer"),
                          test::source_path("configs/tiny.yaml"), "data.train=" + data_, "run.dir=" + run.path(),
                          "train.max_steps=6", "eval.batches=2", "train.micro_batch_size=4"});
  if (r.exit_code != 0 && !test::python_torch_lacks_libuv(r.out).empty()) GTEST_SKIP() << test::python_torch_lacks_libuv(r.out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto summary = nlohmann::json::parse(test::read_text(run / "summary.json"));
  EXPECT_EQ(summary["world_size"], 2);
  EXPECT_EQ(summary["steps"], 6);
  EXPECT_NE(r.out.find("torchrun launch"), std::string::npos) << r.out;
}

TEST_F(DistE2E, SlurmVariablesStartAGroup) {
  TempDir run;
  const int port = test::free_port();
  std::vector<test::Proc> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(test::spawn_bin(
        "trainer", args(data_, run.path(), {"train.max_steps=4", "train.micro_batch_size=4"}), run / ("out" + std::to_string(r)),
        {"OMP_NUM_THREADS=1", "SLURM_PROCID=" + std::to_string(r), "SLURM_NTASKS=2", "SLURM_LOCALID=" + std::to_string(r),
         "SLURM_NTASKS_PER_NODE=2", "SLURM_JOB_NODELIST=localhost", "MASTER_PORT=" + std::to_string(port)}));
  for (auto& p : ranks) ASSERT_EQ(test::wait_proc(p), 0) << test::read_text(run / "out0");
  EXPECT_NE(test::read_text(run / "out0").find("slurm launch"), std::string::npos);
  EXPECT_EQ(nlohmann::json::parse(test::read_text(run / "summary.json"))["world_size"], 2);
}

// A worker SIGKILLed mid-run: launch stops the group, restarts it, the trainer resumes from the
// latest checkpoint, and the run ends exactly as an uninterrupted one.
TEST_F(DistE2E, LaunchRestartsTheGroupWhichResumesExactly) {
  TempDir plain, killed;
  auto run_args = [&](const std::string& dir) {
    std::vector<std::string> a = {"--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--log-dir",
                                  dir + "/launch_logs", "--run-id", "t" + std::to_string(::getpid()) + dir.substr(dir.size() - 6),
                                  "--", test::bin_path("trainer")};
    for (auto& x : args(data_, dir, {"train.max_steps=30", "checkpoint.every_steps=5", "train.micro_batch_size=4",
                                     "model.dropout=0.1"}))
      a.push_back(x);
    return a;
  };
  auto p = test::spawn_bin("launch", run_args(plain.path()), plain / "out");
  ASSERT_EQ(test::wait_proc(p), 0) << test::read_text(plain / "out");

  const auto a = run_args(killed.path());
  const std::string run_id = a[8];
  auto q = test::spawn_bin("launch", a, killed / "out");
  ASSERT_TRUE(test::wait_until(q, [&] { return test::last_train_step(killed / "metrics.jsonl") >= 12; }))
      << test::read_text(killed / "out");
  const int victim = test::find_worker(run_id, 1);
  ASSERT_GT(victim, 0);
  ::kill(victim, SIGKILL);
  ASSERT_EQ(test::wait_proc(q), 0) << test::read_text(killed / "out");
  const std::string out = test::read_text(killed / "out");
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_EQ(train_losses(plain.path()), train_losses(killed.path()));
  EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(killed / "model.safetensors"));
}

}  // namespace
}  // namespace lm
