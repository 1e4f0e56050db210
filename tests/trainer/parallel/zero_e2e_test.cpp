// ZeRO-1 and ZeRO-2 (dist.zero: 1, 2) in real Gloo groups of trainer processes: the same losses,
// norms, weights and EMA as plain data parallelism, the reduce-scatter path within rounding,
// checkpoints that resume at another world size and stage, a rank killed inside a sharded save.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "common/errors.h"
#include "common/torch/compat.h"
#include "tests/testutil.h"
#include "tests/trainer/parallel/group_run.h"
#include "trainer/checkpoint/safetensors.h"
#include "models/registry.h"
#include "run/config/config.h"
#include "trainer/parallel/memory_check.h"
#include "trainer/parallel/zero1.h"
#include "trainer/parallel/piece_reduction.h"
#include "trainer/optim/adamw.h"
#include "trainer/parallel/parallel.h"

namespace lm {
namespace {

using test::TempDir;
using test::expect_same_ema;
using test::loss_and_norm;
using test::losses_as_text;
namespace fs = std::filesystem;

// ---- real Gloo groups of trainers ---------------------------------------------------------------

class ZeroE2E : public ::testing::Test, protected test::GroupRun {
 protected:
  ZeroE2E() {
    common = {"log.every_steps=1", "eval.batches=0", "train.threads=1", "dist.bucket_mb=0.05",
              "model.dropout=0.1", "dist.timeout_s=30"};
  }
};

// dist.zero: 1 against plain data parallelism at the same world size, Gloo: every step's loss and
// grad norm and the final weights bit for bit (the same sums, the same update of each value), with
// clipping active (tiny.yaml: grad_clip 1), dropout, the EMA and gradient accumulation.
TEST_F(ZeroE2E, SameLossesNormsAndWeightsAsPlainDataParallel) {
  for (int world : {2, 4}) {
    TempDir plain, zero;
    const std::vector<std::string> common = {"train.max_steps=8", "train.micro_batch_size=2", "train.ema_decay=0.9",
                                             world == 2 ? "train.grad_accum=2" : "train.grad_accum=1"};
    run_ok(plain.path(), world, common);
    auto z = common;
    z.push_back("dist.zero=1");
    run_ok(zero.path(), world, z);
    const auto a = loss_and_norm(plain.path()), b = loss_and_norm(zero.path());
    ASSERT_EQ(a.size(), 8u);
    EXPECT_EQ(a, b) << "world " << world;
    EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(zero / "model.safetensors")) << "world " << world;
    const std::string log1 = test::read_text(zero / "logs/rank_1.log");
    EXPECT_NE(log1.find("zero-1: rank 1 keeps the AdamW moments of"), std::string::npos) << log1;
    EXPECT_NE(log1.find("all-reduced (the backend has no reduce-scatter"), std::string::npos) << log1;
    // Each rank wrote its own part of the optimizer state; nobody wrote it whole.
    const std::string ckpt = zero / "checkpoints/step_00000008";
    for (int r = 0; r < world; ++r) EXPECT_TRUE(fs::exists(ckpt + "/optimizer.part_" + std::to_string(r) + ".safetensors"));
    EXPECT_FALSE(fs::exists(ckpt + "/optimizer.safetensors"));
    EXPECT_TRUE(fs::exists(plain / "checkpoints/step_00000008/optimizer.safetensors"));
  }
}

// The non-finite skip across shards: a NaN loss at step 3 (LM_FAULT_NAN_STEP, every rank) with
// anomaly.action=skip: no rank steps its pieces nor gathers, and the run goes on bit for bit as
// plain data parallelism's does.
TEST_F(ZeroE2E, ANonFiniteStepIsSkippedOnEveryShard) {
  TempDir plain, zero;
  const std::vector<std::string> common = {"train.max_steps=6", "train.micro_batch_size=2", "anomaly.action=skip",
                                           "train.ema_decay=0.9"};
  run_ok(plain.path(), 2, common, {"LM_FAULT_NAN_STEP=3"});
  auto z = common;
  z.push_back("dist.zero=1");
  run_ok(zero.path(), 2, z, {"LM_FAULT_NAN_STEP=3"});
  auto losses = [](const std::string& dir) {
    std::vector<std::string> out;
    for (auto& l : test::metrics_of_kind(dir + "/metrics.jsonl", "train")) {
      const auto j = nlohmann::json::parse(l);
      out.push_back(j["loss"].dump() + " " + j["grad_norm"].dump());
    }
    return out;
  };
  const auto a = losses(plain.path());
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[2].substr(0, 4), "null") << a[2];  // the skipped step's loss is not finite
  EXPECT_EQ(a, losses(zero.path()));
  EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(zero / "model.safetensors"));
  auto ea = load_safetensors(plain / "checkpoints/step_00000006/ema.safetensors");
  auto eb = load_safetensors(zero / "checkpoints/step_00000006/ema.safetensors");
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) EXPECT_TRUE(torch::equal(ea[i].second, eb[i].second)) << ea[i].first;
}

// The GPU's optimizer path on a CPU (LibTorch >= 2.4: bash launch/dev/torch2.sh): at::_fused_adamw_
// over each rank's segments, the clip coefficient as its grad_scale, the EMA; cut at step 3 and
// resumed: bit for bit plain data parallelism's run.
TEST_F(ZeroE2E, FusedAdamWClipInStepAndResumeSameAsPlain) {
  if (!compat::kHasCpuFusedAdamW)
    GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no CPU fused AdamW (>= 2.4): "
                 << "bash launch/dev/torch2.sh runs this against LibTorch 2.6";
  TempDir plain, zero;
  const std::vector<std::string> common = {"train.micro_batch_size=2", "optim.fused=on", "optim.clip_in_step=on",
                                           "optim.grad_clip=0.5", "train.ema_decay=0.9", "checkpoint.every_steps=3"};
  for (const auto& [dir, zero_on] : {std::pair{plain.path(), false}, std::pair{zero.path(), true}}) {
    for (int64_t steps : {3, 6}) {
      auto a = common;
      a.push_back("train.max_steps=" + std::to_string(steps));
      if (zero_on) a.push_back("dist.zero=1");
      run_ok(dir, 2, a);
    }
  }
  EXPECT_NE(test::read_text(zero / "logs/rank_0.log").find("resumed from"), std::string::npos);
  EXPECT_EQ(loss_and_norm(plain.path()), loss_and_norm(zero.path()));
  EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(zero / "model.safetensors"));
}

// The path NCCL takes (reduce-scatter: only the owned pieces hold the sums, the norm from the
// pieces), on Gloo: LM_ZERO_REDUCE_SCATTER=1 all-reduces a copy and keeps the owned piece. The
// sums of 4 ranks are added in another order than the whole bucket's all-reduce (Gloo's ring
// cuts the buffer by its length) and the norm is summed by pieces: not the same bits, the same
// run within float rounding.
TEST_F(ZeroE2E, ReduceScatterPathMatchesPlainWithinRounding) {
  TempDir plain, zero;
  const std::vector<std::string> common = {"train.max_steps=8", "train.micro_batch_size=2"};
  run_ok(plain.path(), 4, common);
  auto z = common;
  z.push_back("dist.zero=1");
  run_ok(zero.path(), 4, z, {"LM_ZERO_REDUCE_SCATTER=1"});
  EXPECT_NE(test::read_text(zero / "logs/rank_2.log").find("gradients reduce-scattered"), std::string::npos);
  const auto a = loss_and_norm(plain.path()), b = loss_and_norm(zero.path());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i].first, b[i].first, 1e-5 * a[i].first) << "loss, step " << i + 1;
    EXPECT_NEAR(a[i].second, b[i].second, 1e-5 * a[i].second) << "grad norm, step " << i + 1;
  }
  // The weights: a value whose gradient is rounding noise (a bias near zero) may get AdamW's step
  // (about lr) in the other direction, so the bound is in steps of lr, not relative.
  auto wa = load_safetensors(plain / "model.safetensors"), wb = load_safetensors(zero / "model.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  double worst = 0;
  for (size_t i = 0; i < wa.size(); ++i) worst = std::max(worst, (wa[i].second - wb[i].second).abs().max().item<double>());
  EXPECT_GT(worst, 0.0);  // another summation order: not the same bits (else this test tests nothing new)
  EXPECT_LT(worst, 3e-3) << "max |difference| of a weight; lr is 3e-3";
}

// Saved at 4 ranks, resumed at 2, then at 1 (no ZeRO), then at 4 again: every step's loss and the
// final weights bit for bit those of the same chain of plain data parallelism (each checkpoint
// holds the same state, cut into parts or whole), and close to a run never cut at the new world
// size with the same global batch (16 rows: 4x4, 2x8, 1x16). No dropout here: each rank draws its
// own masks, so a run at another world size masks other values (the same run, not the same
// numbers); without it the runs differ by the order the ranks' sums were added in only.
TEST_F(ZeroE2E, CheckpointsReshardAcrossWorldSizes) {
  TempDir p, z, never;
  struct Leg {
    int world;
    int64_t micro, steps;
  };
  const std::vector<Leg> chain = {{4, 4, 4}, {2, 8, 8}, {1, 16, 12}, {4, 4, 14}};
  std::string prev_p, prev_z;
  for (size_t i = 0; i < chain.size(); ++i) {
    const auto& leg = chain[i];
    const std::string dp = p / ("leg" + std::to_string(i)), dz = z / ("leg" + std::to_string(i));
    std::vector<std::string> a = {"train.micro_batch_size=" + std::to_string(leg.micro),
                                  "train.max_steps=" + std::to_string(leg.steps), "checkpoint.every_steps=2",
                                  "model.dropout=0.0"};
    auto ap = a, az = a;
    if (!prev_p.empty()) ap.push_back("checkpoint.resume=" + prev_p), az.push_back("checkpoint.resume=" + prev_z);
    az.push_back("dist.zero=1");
    run_ok(dp, leg.world, ap);
    run_ok(dz, leg.world, az);
    if (i > 0) {
      EXPECT_NE(test::read_text(dz + "/logs/rank_0.log").find("resumed from"), std::string::npos);
    }
    EXPECT_EQ(loss_and_norm(dp), loss_and_norm(dz)) << "leg " << i << " (world " << leg.world << ")";
    EXPECT_EQ(test::read_text(dp + "/model.safetensors"), test::read_text(dz + "/model.safetensors")) << "leg " << i;
    char name[32];
    std::snprintf(name, sizeof name, "/checkpoints/step_%08lld", static_cast<long long>(leg.steps));
    prev_p = dp + name, prev_z = dz + name;
    EXPECT_EQ(fs::exists(prev_z + "/optimizer.part_0.safetensors"), leg.world > 1) << prev_z;
  }
  // The resumed legs against runs never cut at their world size (the first legs' sums were added at
  // another world size: close, not the same bits).
  run_ok(never.path(), 2, {"train.micro_batch_size=8", "train.max_steps=8", "model.dropout=0.0"});
  const auto cut = loss_and_norm(z / "leg1"), whole = loss_and_norm(never.path());
  ASSERT_EQ(cut.size(), 4u);
  for (size_t i = 0; i < cut.size(); ++i)
    EXPECT_NEAR(cut[i].first, whole[4 + i].first, 1e-4 * whole[4 + i].first) << "step " << 5 + i;
}

// A ZeRO-1 run's checkpoint serves export and generate as any other (the weights are whole, rank 0's).
TEST_F(ZeroE2E, ExportAndGenerateReadAZeroCheckpoint) {
  TempDir z, out;
  run_ok(z.path(), 2, {"train.max_steps=4", "train.micro_batch_size=2", "dist.zero=1"});
  const std::string weights = z / "checkpoints/step_00000004/model.safetensors";
  auto e = test::spawn_bin("export", {"--run", z.path(), "--format", "hf", "--weights", weights, out / "hf"}, out / "export.out");
  ASSERT_EQ(test::wait_proc(e), 0) << test::read_text(out / "export.out");
  EXPECT_TRUE(fs::exists(out / "hf/model.safetensors"));
  auto g = test::spawn_bin("generate", {"--run", z.path(), "--weights", weights, "--tokens", "8", "--prompt", "In the"},
                           out / "gen.out");
  ASSERT_EQ(test::wait_proc(g), 0) << test::read_text(out / "gen.out");
}

// Rank 1 SIGKILLed right after it wrote its part of step 4's checkpoint: step 4 never looks
// committed (rank 0 waits for rank 1's files, which never come), the group fails, and the restarted
// group resumes from step 2 and ends as an uncut run.
TEST_F(ZeroE2E, ARankKilledInsideAShardedSaveLeavesNoCommittedCheckpoint) {
  TempDir plain, zero;
  const std::vector<std::string> a = {"train.max_steps=6", "train.micro_batch_size=2", "checkpoint.every_steps=2",
                                      "dist.zero=1", "checkpoint.commit_timeout_s=5"};
  run_ok(plain.path(), 2, a);
  const auto codes = run(zero.path(), 2, a, {}, "LM_FAULT_KILL_IN_SAVE=4");
  EXPECT_EQ(codes[1], 128 + SIGKILL);
  EXPECT_NE(codes[0], 0);
  EXPECT_TRUE(fs::exists(zero / "checkpoints/step_00000002"));
  EXPECT_FALSE(fs::exists(zero / "checkpoints/step_00000004")) << "a save missing rank 1's part was committed";
  run_ok(zero.path(), 2, a);
  EXPECT_NE(test::read_text(zero / "logs/rank_0.log").find("at step 2"), std::string::npos);
  EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(zero / "model.safetensors"));
  EXPECT_EQ(loss_and_norm(plain.path()), loss_and_norm(zero.path()));
}

// ---- ZeRO-2 (dist.zero: 2) ----------------------------------------------------------------------

// Each step's loss and grad norm as metrics.jsonl writes them (a non-finite one is null).
// dist.zero: 2 against plain data parallelism at the same world size over Gloo: every step's loss
// and grad norm, the final weights and the EMA bit for bit, with clipping (grad_clip 0.05
// clips every step), a non-finite step skipped (LM_FAULT_NAN_STEP), the EMA; at 2 ranks GPT with
// dropout, gradient accumulation and activation checkpointing, at 4 ranks Llama (GQA, untied head;
// it has no dropout). Checked
// to fail with the norm taken from the pieces' sums of squares (the streamed FlatNorm not used): at 2 ranks
// 2.92814564704895 at step 1 against plain data parallelism's 2.928135395050049, and other weights.
// The reduce-scatter path (the sums added in another order too) gives 0.9295907 against 0.9295713
// at 4 ranks (Llama; ZeRO-1's reduce-scatter path the same).
TEST_F(ZeroE2E, ZeroTwoSameLossesNormsWeightsAndEmaAsPlainDataParallel) {
  for (int world : {2, 4}) {
    TempDir plain, zero;
    std::vector<std::string> common = {"train.max_steps=6", "train.micro_batch_size=2", "train.ema_decay=0.9",
                                       "anomaly.action=skip", "optim.grad_clip=0.05", "checkpoint.every_steps=6"};
    if (world == 2) {
      common.insert(common.end(), {"train.grad_accum=2", "train.activation_checkpointing=block"});
    } else {
      // Llama has no dropout (the shared args' model.dropout=0.1 overridden back).
      common.insert(common.end(), {"model.arch=llama", "model.n_head=4", "model.n_kv_head=2", "model.ffn_multiple_of=32",
                                   "model.tie_embeddings=false", "model.dropout=0"});
    }
    run_ok(plain.path(), world, common, {"LM_FAULT_NAN_STEP=3"});
    auto z = common;
    z.push_back("dist.zero=2");
    run_ok(zero.path(), world, z, {"LM_FAULT_NAN_STEP=3"});
    const auto a = losses_as_text(plain.path()), b = losses_as_text(zero.path());
    ASSERT_EQ(a.size(), 6u);
    EXPECT_EQ(a[2].substr(0, 4), "null") << a[2];  // the skipped step's loss is not finite
    EXPECT_EQ(a, b) << "world " << world;
    EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(zero / "model.safetensors")) << "world " << world;
    expect_same_ema(plain.path(), zero.path(), 6);
    const std::string log1 = test::read_text(zero / "logs/rank_1.log");
    EXPECT_NE(log1.find("zero-2: rank 1 keeps the summed gradients and the AdamW moments of"), std::string::npos) << log1;
    EXPECT_NE(log1.find("norm streamed bucket by bucket"), std::string::npos) << log1;
    const std::string ckpt = zero / "checkpoints/step_00000006";
    for (int r = 0; r < world; ++r) EXPECT_TRUE(fs::exists(ckpt + "/optimizer.part_" + std::to_string(r) + ".safetensors"));
    EXPECT_FALSE(fs::exists(ckpt + "/optimizer.safetensors"));
  }
}

// The path NCCL takes on Gloo (LM_ZERO_REDUCE_SCATTER=1: each bucket reduce-scattered into the
// rank's pieces, the norm from the pieces' sums of squares): the same run within float rounding.
TEST_F(ZeroE2E, ZeroTwoReduceScatterPathMatchesPlainWithinRounding) {
  TempDir plain, zero;
  const std::vector<std::string> common = {"train.max_steps=6", "train.micro_batch_size=2"};
  run_ok(plain.path(), 4, common);
  auto z = common;
  z.push_back("dist.zero=2");
  run_ok(zero.path(), 4, z, {"LM_ZERO_REDUCE_SCATTER=1"});
  EXPECT_NE(test::read_text(zero / "logs/rank_3.log").find("gradients reduce-scattered, norm from the pieces"),
            std::string::npos);
  const auto a = loss_and_norm(plain.path()), b = loss_and_norm(zero.path());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i].first, b[i].first, 1e-5 * a[i].first) << "loss, step " << i + 1;
    EXPECT_NEAR(a[i].second, b[i].second, 1e-5 * a[i].second) << "grad norm, step " << i + 1;
  }
}

// Checkpoints across stages and world sizes: dist.zero 2 at 4 ranks -> 0 at 1 rank -> 2 at 2 ranks
// -> 1 at 2 ranks, against the same chain unsharded (0 at 4, 1, 2, 2 ranks): every step's loss and
// norm and each leg's final weights bit for bit; each sharded leg wrote one optimizer part per rank.
TEST_F(ZeroE2E, ZeroTwoCheckpointsReshardAcrossStagesAndWorldSizes) {
  TempDir p, z;
  struct Leg {
    int world;
    int64_t zero, micro, steps;
  };
  const std::vector<Leg> chain = {{4, 2, 2, 4}, {1, 0, 8, 6}, {2, 2, 4, 9}, {2, 1, 4, 11}};
  std::string prev_p, prev_z;
  for (size_t i = 0; i < chain.size(); ++i) {
    const auto& leg = chain[i];
    const std::string dp = p / ("leg" + std::to_string(i)), dz = z / ("leg" + std::to_string(i));
    std::vector<std::string> a = {"train.micro_batch_size=" + std::to_string(leg.micro),
                                  "train.max_steps=" + std::to_string(leg.steps), "checkpoint.every_steps=1",
                                  "train.ema_decay=0.9"};
    auto ap = a, az = a;
    if (!prev_p.empty()) ap.push_back("checkpoint.resume=" + prev_p), az.push_back("checkpoint.resume=" + prev_z);
    az.push_back("dist.zero=" + std::to_string(leg.zero));
    run_ok(dp, leg.world, ap);
    run_ok(dz, leg.world, az);
    if (i > 0) {
      EXPECT_NE(test::read_text(dz + "/logs/rank_0.log").find("resumed from"), std::string::npos);
    }
    EXPECT_EQ(loss_and_norm(dp), loss_and_norm(dz)) << "leg " << i << " (world " << leg.world << ")";
    EXPECT_EQ(test::read_text(dp + "/model.safetensors"), test::read_text(dz + "/model.safetensors")) << "leg " << i;
    expect_same_ema(dp, dz, leg.steps);
    char name[32];
    std::snprintf(name, sizeof name, "/checkpoints/step_%08lld", static_cast<long long>(leg.steps));
    prev_p = dp + name, prev_z = dz + name;
    EXPECT_EQ(fs::exists(prev_z + "/optimizer.part_0.safetensors"), leg.zero > 0 && leg.world > 1) << prev_z;
  }
}

}  // namespace
}  // namespace lm