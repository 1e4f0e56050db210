// Exact resume with real processes and real SIGKILL: a run of S steps, and the same command killed
// at several moments (between steps, mid-step, in the middle of writing a checkpoint) and started
// again, give identical per-step losses and byte-identical final weights. Covers dropout,
// shuffling, gradient accumulation, both loader modes, EMA, async checkpoints and 2 ranks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>

#include "common/torch/compat.h"
#include "common/files.h"
#include "tests/testutil.h"
#include "trainer/checkpoint/reader.h"
#include "run/run_dir.h"

namespace lm {
namespace {

using test::TempDir;

bool fs_exists(const std::string& p) { return std::ifstream(p).good(); }
std::string step_dir(int64_t step) { return run_dir::step_name(step); }

class ResumeE2E : public ::testing::Test {
 protected:
  const std::string data_ = test::shared_bytes_dataset();
};

constexpr int kSteps = 36;

std::vector<std::string> args_for(const std::string& data, const std::string& run_dir,
                                  const std::vector<std::string>& extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + data,
                                "run.dir=" + run_dir, "train.max_steps=" + std::to_string(kSteps),
                                "log.every_steps=1", "eval.batches=0", "checkpoint.every_steps=5",
                                "checkpoint.keep_last=2", "train.threads=1", "dist.timeout_s=30"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// Starts `ranks` trainer processes of one group (fresh rendezvous port per attempt).
std::vector<test::Proc> start_group(const std::vector<std::string>& args, int ranks, const std::string& log,
                                    const std::vector<std::string>& extra_env = {}) {
  std::vector<test::Proc> procs;
  const int port = test::free_port();
  for (int r = 0; r < ranks; ++r) {
    std::vector<std::string> env = test::rank_env(r, ranks, port);
    env.insert(env.end(), extra_env.begin(), extra_env.end());
    procs.push_back(test::spawn_bin("trainer", args, log + ".rank" + std::to_string(r), env));
  }
  return procs;
}

void kill_group(std::vector<test::Proc>& procs) {
  for (auto& p : procs) test::kill_proc(p, SIGKILL);
  for (auto& p : procs) test::wait_proc(p, 30);
}

int finish_group(std::vector<test::Proc>& procs) {
  int worst = 0;
  for (auto& p : procs) worst = std::max(worst, test::wait_proc(p, 300));
  return worst;
}

// The last lines of every rank's console output (log: start_group's) and of its log file in
// run_dir/logs: what a failure message shows (the other ranks' errors are only there).
std::string group_tail(const std::string& run_dir, const std::string& log, int ranks) {
  auto tail = [](const std::string& path) {
    std::string t;
    for (auto& line : files::tail_lines(path, 25)) t += "\n" + line;
    return t;
  };
  std::string out;
  for (int r = 0; r < ranks; ++r) {
    const std::string rs = std::to_string(r);
    out += "\n--- rank " + rs + " output:" + tail(log + ".rank" + rs);
    out += "\n--- rank " + rs + " log file:" + tail(run_dir + "/logs/rank_" + rs + ".log");
  }
  return out;
}

std::map<int64_t, double> losses(const std::string& run_dir) {
  std::map<int64_t, double> out;
  for (auto& line : test::metrics_of_kind(run_dir + "/metrics.jsonl", "train")) {
    auto j = nlohmann::json::parse(line);
    out[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return out;
}

// Baseline run, then the same command killed three times and restarted until it finishes.
void expect_exact_resume(const std::string& data, const std::vector<std::string>& extra, int ranks = 1) {
  TempDir a, b;
  auto base = start_group(args_for(data, a.path(), extra), ranks, a / "out");
  ASSERT_EQ(finish_group(base), 0) << group_tail(a.path(), a / "out", ranks);
  const auto want = losses(a.path());
  ASSERT_EQ(want.size(), static_cast<size_t>(kSteps));

  const auto args = args_for(data, b.path(), extra);
  const std::string metrics = b / "metrics.jsonl";
  // 1: killed right after step 7 was logged (between steps or early in step 8).
  auto g = start_group(args, ranks, b / "out1");
  ASSERT_TRUE(test::wait_until(g[0], [&] { return test::last_train_step(metrics) >= 7; }))
      << group_tail(b.path(), b / "out1", ranks);
  kill_group(g);
  // 2: resumes from step 5, then is killed while writing the step-15 checkpoint.
  g = start_group(args, ranks, b / "out2", {"LM_FAULT_KILL_IN_SAVE=15"});
  for (auto& p : g) {
    // Killed by the hook, not by the timeout (which also SIGKILLs): well before it, and the
    // step-15 checkpoint left half-written.
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(test::wait_proc(p, 120), 128 + SIGKILL) << "expected the fault hook to kill it";
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 110) << "hung: killed by the timeout";
  }
  EXPECT_TRUE(fs_exists(b / ("checkpoints/" + step_dir(15) + ".tmp"))) << "the hook did not fire in the step-15 save";
  EXPECT_FALSE(fs_exists(b / ("checkpoints/" + step_dir(15))));
  // 3: resumes from step 10 (15 never committed); killed mid-run a few steps later.
  g = start_group(args, ranks, b / "out3");
  ASSERT_TRUE(test::wait_until(g[0], [&] { return test::last_train_step(metrics) >= 18; }))
      << group_tail(b.path(), b / "out3", ranks);
  ::usleep(3000);
  kill_group(g);
  // 4: runs to the end.
  g = start_group(args, ranks, b / "out4");
  ASSERT_EQ(finish_group(g), 0) << group_tail(b.path(), b / "out4", ranks);

  const auto got = losses(b.path());
  ASSERT_EQ(got.size(), want.size());
  for (auto& [step, loss] : want) EXPECT_EQ(got.at(step), loss) << "step " << step;
  EXPECT_EQ(test::read_text(a / "model.safetensors"), test::read_text(b / "model.safetensors"));
  // The last checkpoint's every file but the manifest's timestamps-free bytes: weights, AdamW
  // moments, EMA (when on), and the JSON state of every component. A missing file fails.
  const std::string last = "/checkpoints/" + step_dir(kSteps) + "/";
  const bool ema = std::find_if(extra.begin(), extra.end(), [](auto& e) { return e.rfind("train.ema_decay=", 0) == 0; }) != extra.end();
  std::vector<std::string> files = {"model.safetensors", "optimizer.safetensors", "state.json", "rank_0.json", "manifest.json"};
  if (ema) files.push_back("ema.safetensors");
  for (const auto& f : files) {
    ASSERT_TRUE(fs_exists(a.path() + last + f)) << a.path() + last + f;
    ASSERT_TRUE(fs_exists(b.path() + last + f)) << b.path() + last + f;
    if (f == "state.json" || f == "manifest.json") continue;  // state.json holds the config (run.dir differs)
    EXPECT_EQ(test::read_text(a.path() + last + f), test::read_text(b.path() + last + f)) << f;
  }
  // state.json: every component's values equal but the two that hold wall-clock times (metrics
  // windows, long window); the run facts hold the run directory.
  auto sa = nlohmann::json::parse(test::read_text(a.path() + last + "state.json"))["components"];
  auto sb = nlohmann::json::parse(test::read_text(b.path() + last + "state.json"))["components"];
  for (const char* timed : {"metrics", "long_window"}) sa.erase(timed), sb.erase(timed);
  EXPECT_GE(sa.size(), 4u) << sa.dump();
  EXPECT_EQ(sa.dump(), sb.dump());
  // The resumed attempts logged their recovery.
  EXPECT_GE(test::metrics_of_kind(metrics, "resume").size(), 1u);
}

TEST_F(ResumeE2E, PackedShuffledDropoutGradAccum) {
  expect_exact_resume(data_, {"model.dropout=0.1", "train.grad_accum=2", "data.shuffle_buffer=64"});
}

TEST_F(ResumeE2E, BucketedDropoutEma) {
  expect_exact_resume(data_, {"data.mode=bucketed", "model.dropout=0.1", "train.ema_decay=0.9"});
}

TEST_F(ResumeE2E, AsyncCheckpoints) {
  expect_exact_resume(data_, {"checkpoint.async=true", "model.dropout=0.1"});
}

// The GPU's path on a CPU (LibTorch >= 2.4, bash launch/dev/torch2.sh): at::_fused_adamw_ gated on the
// device, bf16 autocast, EMA gated the same way, SDPA with dropout.
TEST_F(ResumeE2E, FusedAdamWBf16Ema) {
  if (!compat::kHasCpuFusedAdamW || !compat::kHasCpuAutocast)
    GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no CPU fused AdamW / autocast (>= 2.4): "
                 << "bash launch/dev/torch2.sh runs this against LibTorch 2.6";
  expect_exact_resume(data_, {"optim.fused=on", "train.dtype=bf16", "train.ema_decay=0.9", "model.dropout=0.1"});
}

// Free per-parameter gradients and clipping inside the fused AdamW (optim.free_grads,
// optim.clip_in_step; LibTorch >= 2.4 on a CPU) with gradient accumulation and the EMA.
TEST_F(ResumeE2E, FreeGradsClipInStepGradAccum) {
  if (!compat::kHasCpuFusedAdamW)
    GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no CPU fused AdamW (>= 2.4): "
                 << "bash launch/dev/torch2.sh runs this against LibTorch 2.6";
  expect_exact_resume(data_, {"optim.fused=on", "optim.free_grads=on", "optim.clip_in_step=on", "optim.grad_clip=0.5",
                              "train.grad_accum=2", "train.ema_decay=0.9"});
}

// train.activation_checkpointing=block: the reruns' dropout draws start from the saved generator
// states, so a resumed run draws what the uncut one drew.
TEST_F(ResumeE2E, ActivationCheckpointingDropoutGradAccum) {
  expect_exact_resume(data_, {"train.activation_checkpointing=block", "model.dropout=0.1", "train.grad_accum=2"});
}

TEST_F(ResumeE2E, TwoRanks) {
  expect_exact_resume(data_, {"model.dropout=0.1", "train.micro_batch_size=4"}, 2);
}

// data.doc_mask: the documents' mask is a function of the batch alone, so a resumed run computes
// what the uncut one did, with activation checkpointing and gradient accumulation.
// Checked to fail with a mask that depends on the process's history (doc_mask_of off after 40 calls).
TEST_F(ResumeE2E, DocMaskActivationCheckpointingGradAccum) {
  expect_exact_resume(data_, {"data.doc_mask=true", "train.activation_checkpointing=block", "train.grad_accum=2"});
}

}  // namespace
}  // namespace lm

namespace lm {
namespace {

std::vector<std::string> quick_args(const std::string& data, const std::string& run, std::vector<std::string> extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + data, "run.dir=" + run,
                                "log.every_steps=1", "eval.batches=0", "train.threads=1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST_F(ResumeE2E, SigtermCheckpointsAndExitsZeroThenResumes) {
  TempDir run;
  auto p = test::spawn_bin("trainer", quick_args(data_, run.path(), {"train.max_steps=100000"}), run / "out1");
  ASSERT_TRUE(test::wait_until(p, [&] { return test::last_train_step(run / "metrics.jsonl") >= 3; }));
  test::kill_proc(p, SIGTERM);
  ASSERT_EQ(test::wait_proc(p, 60), 0) << test::read_text(run / "out1");
  const int64_t stopped = test::last_train_step(run / "metrics.jsonl");
  EXPECT_TRUE(fs_exists(run.path() + "/checkpoints/" + step_dir(stopped) + "/manifest.json"));
  auto r = test::run_bin("trainer", quick_args(data_, run.path(), {"train.max_steps=" + std::to_string(stopped + 3)}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos);
  EXPECT_EQ(test::last_train_step(run / "metrics.jsonl"), stopped + 3);
}

TEST_F(ResumeE2E, SecondSignalAbortsAtOnce) {
  TempDir run;
  // Steps of a few hundred ms, so both signals land inside one step.
  auto p = test::spawn_bin("trainer", quick_args(data_, run.path(), {"train.max_steps=100000", "model.d_model=256",
                                                                       "model.n_head=4", "model.seq_len=256",
                                                                       "train.micro_batch_size=16"}),
                           run / "out");
  ASSERT_TRUE(test::wait_until(p, [&] { return test::last_train_step(run / "metrics.jsonl") >= 1; }, 120));
  test::kill_proc(p, SIGINT);
  ::usleep(20000);
  test::kill_proc(p, SIGINT);
  EXPECT_EQ(test::wait_proc(p, 60), 128 + SIGINT) << test::read_text(run / "out");
}

TEST_F(ResumeE2E, OtherArchitectureOrDataIsRefusedUnlessForced) {
  TempDir run, other;
  ASSERT_EQ(test::run_bin("trainer", quick_args(data_, run.path(), {"train.max_steps=4"})).exit_code, 0);
  auto r = test::run_bin("trainer", quick_args(data_, run.path(), {"train.max_steps=8", "model.n_layer=3"}));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("has model architecture"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("checkpoint.force"), std::string::npos) << r.out;
  const std::string other_data = test::make_bytes_dataset(other.path(), 500);
  r = test::run_bin("trainer", quick_args(other_data, run.path(), {"train.max_steps=8"}));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("has data version"), std::string::npos) << r.out;
  r = test::run_bin("trainer", quick_args(other_data, run.path(), {"train.max_steps=8", "checkpoint.force=true"}));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("loading anyway"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
}

TEST_F(ResumeE2E, AutoIntervalFromYoungDaly) {
  TempDir run;
  // An MTBF of 3.6 ms makes sqrt(2 * MTBF * C) 8-19 ms for a save stall C of 10-50 ms: a handful of
  // steps even where LibTorch 2.14 steps this model in 2 ms (an MTBF of 0.36 s gave intervals of 30
  // steps there, so 60 steps saved twice).
  auto r = test::run_bin("trainer", quick_args(data_, run.path(), {"train.max_steps=60", "checkpoint.every_steps=auto",
                                                                    "checkpoint.mtbf_hours=0.000001", "checkpoint.keep_last=0"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("checkpoint interval:"), std::string::npos) << r.out;
  EXPECT_GE(test::metrics_of_kind(run / "metrics.jsonl", "checkpoint").size(), 3u);
}

TEST_F(ResumeE2E, WeightsReadableWithNumpyAlone) {
  TempDir run;
  ASSERT_EQ(test::run_bin("trainer", quick_args(data_, run.path(), {"train.max_steps=2"})).exit_code, 0);
  // docs/runs.md's numpy-only load, verbatim.
  test::write_text(run / "load.py",
                   "import json, numpy as np, sys\n"
                   "raw = open(sys.argv[1], 'rb').read(); n = int.from_bytes(raw[:8], 'little'); head = json.loads(raw[8:8 + n])\n"
                   "w = {k: np.frombuffer(raw, np.float32, int(np.prod(v['shape'])), 8 + n + v['data_offsets'][0]).reshape(v['shape']) for k, v in head.items() if k != '__metadata__'}\n"
                   "print(len(w), w['wte.weight'].shape, float(np.abs(w['lnf.weight']).sum()))\n");
  auto r = test::run_bin("/usr/bin/python3", {run / "load.py", run / "model.safetensors"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("(320, 64)"), std::string::npos) << r.out;  // bytes vocab 258 padded to 320, d 64
}

}  // namespace
}  // namespace lm

namespace lm {
namespace {

// A real write failure in the middle of a save (a file-size limit: the checkpoint's files are
// bigger than it, the metrics and logs are not): one clear error, earlier checkpoints intact, and
// training stops (on_error=stop) or goes on (continue).
TEST_F(ResumeE2E, FailedSaveKeepsEarlierCheckpointsAndStopsOrContinues) {
  TempDir run;
  auto base = quick_args(data_, run.path(), {"train.max_steps=5", "checkpoint.every_steps=5"});
  ASSERT_EQ(test::run_bin("trainer", base).exit_code, 0);
  const std::string good = run / "checkpoints/step_00000005";
  auto limited = [&](std::vector<std::string> extra) {
    auto a = quick_args(data_, run.path(), {"train.max_steps=10", "checkpoint.every_steps=5"});
    a.insert(a.end(), extra.begin(), extra.end());
    std::string cmd = "ulimit -f 1024 && exec '" + test::bin_path("trainer") + "'";  // 1 MB files at most
    for (auto& x : a) cmd += " '" + x + "'";
    return test::run_bin("/bin/sh", {"-c", cmd});
  };
  auto r = limited({"checkpoint.on_error=stop"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("checkpoint at step 10 failed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("write failed"), std::string::npos) << r.out;
  EXPECT_EQ(CheckpointReader::verify(good), "");
  EXPECT_FALSE(fs_exists(run / "checkpoints/step_00000010/manifest.json"));
  r = limited({"checkpoint.on_error=continue", "train.max_steps=12"});
  EXPECT_NE(r.out.find("checkpoint at step 10 failed"), std::string::npos) << r.out;
  EXPECT_EQ(test::last_train_step(run / "metrics.jsonl"), 12);  // training went on past the failure
  EXPECT_EQ(CheckpointReader::verify(good), "");
}

}  // namespace
}  // namespace lm
