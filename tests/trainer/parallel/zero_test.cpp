// ZeRO-1 (dist.zero: 1): the layout, the sharded AdamW against the whole-buffer one, its state
// resharded across world sizes, and real Gloo groups of trainer processes: the same losses and
// weights as plain data parallelism, checkpoints that resume at another world size, a rank killed
// inside a sharded save.
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
#include "trainer/checkpoint/safetensors.h"
#include "models/registry.h"
#include "trainer/config/config.h"
#include "trainer/step/memory_check.h"
#include "trainer/parallel/zero1.h"
#include "trainer/parallel/zero2.h"
#include "trainer/optim/adamw.h"
#include "trainer/parallel/parallel.h"

namespace lm {
namespace {

using test::TempDir;
namespace fs = std::filesystem;

// ---- the parallelism seam's table (trainer/parallel/parallel.cpp) ---------------------------------

// What a rank keeps, before anything is built: the strategy the table picks for dist.zero and the
// world size, asked through the seam (the memory check's only source). Checked to fail with the
// zero1 row's optimizer bytes not divided by the world size.
TEST(Parallelism, TheTablePicksTheStrategyAndTheBytesARankKeeps) {
  const double n = 1000, adamw = 8;
  DistConfig plain, zero1;
  zero1.zero = 1;
  for (int world : {1, 2, 4}) {
    const RankBytes p = rank_bytes(plain, world, n, adamw);
    EXPECT_DOUBLE_EQ(p.weights, 4 * n);
    EXPECT_DOUBLE_EQ(p.grads, 4 * n);
    EXPECT_DOUBLE_EQ(p.optimizer, 8 * n) << "world " << world;
    const RankBytes z = rank_bytes(zero1, world, n, adamw);
    EXPECT_DOUBLE_EQ(z.weights, 4 * n);
    EXPECT_DOUBLE_EQ(z.optimizer, 8 * n / world) << "world " << world;  // world 1: one process, nothing to shard
  }
}

// ZeRO-2's row: the gradients kept are this rank's pieces plus the buckets in flight (grad_accum
// 1), or every gradient between micro-batches (grad_accum > 1); only it keeps the gradients in
// pieces (no flat gradient buffer); the stage in words names it.
TEST(Parallelism, ZeroTwoKeepsItsPiecesOfTheGradients) {
  const double n = 4e7, adamw = 8;
  DistConfig z2;
  z2.zero = 2;
  z2.bucket_mb = 1;
  for (int world : {2, 4}) {
    const RankBytes b = rank_bytes(z2, world, n, adamw);
    EXPECT_DOUBLE_EQ(b.weights, 4 * n);
    EXPECT_DOUBLE_EQ(b.grads, 4 * n / world + (Zero2::kInFlight + 1) * 1e6) << "world " << world;
    EXPECT_DOUBLE_EQ(b.optimizer, 8 * n / world);
    EXPECT_NE(b.stage.find("dist.zero=2 at " + std::to_string(world) + " ranks"), std::string::npos) << b.stage;
    EXPECT_DOUBLE_EQ(rank_bytes(z2, world, n, adamw, /*grad_accum=*/2).grads, 4 * n / world + 4 * n);
    EXPECT_TRUE(grads_in_pieces(z2, world, true));
  }
  EXPECT_FALSE(grads_in_pieces(z2, 1, false)) << "one process: nothing to shard";
  DistConfig z1;
  z1.zero = 1;
  EXPECT_FALSE(grads_in_pieces(z1, 4, true));
  EXPECT_FALSE(grads_in_pieces(DistConfig{}, 4, true));
  EXPECT_DOUBLE_EQ(rank_bytes(z2, 1, n, adamw).grads, 4 * n);
}

// The memory check counts each stage, and a config that cannot fit is refused in one line naming
// the stage that would not fit.
TEST(Parallelism, TheMemoryCheckCountsEachStageAndNamesIt) {
  auto cfg = load_config(test::source_path("configs/tiny.yaml"), {"model.d_model=768", "model.n_head=12",
                                                                  "model.n_layer=12", "model.seq_len=128"});
  const double n = static_cast<double>(param_count(cfg.model, 258));
  double before = 1e300;
  for (int64_t zero : {0, 1, 2}) {
    cfg.dist.zero = zero;
    const auto e = estimate_memory(cfg, 258, false, 4);
    EXPECT_LT(e.optimizer, before) << "dist.zero=" << zero << " keeps less than the stage before";
    before = e.optimizer;
    EXPECT_NE(e.stage.find("dist.zero=" + std::to_string(zero) + " at 4 ranks"), std::string::npos) << e.stage;
  }
  EXPECT_NEAR(estimate_memory(cfg, 258, false, 4).optimizer,
              4 * n / 4 + 8 * n / 4 + std::min(4 * n, 3 * cfg.dist.bucket_mb * 1e6), 1);
  auto big = load_config(test::source_path("configs/tiny.yaml"),
                         {"model.d_model=65536", "model.n_head=64", "model.n_layer=64", "dist.zero=2"});
  try {
    check_memory_fits(big, 258, torch::Device(torch::kCPU), 4);
    ADD_FAILURE() << "no ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("per rank under dist.zero=2 at 4 ranks"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
}

// The norm streamed bucket by bucket (ZeRO-2's all-reduce path) is LibTorch's own norm of the
// whole vector, bit for bit, however the vector is cut. The other ways of adding the squares (8
// lanes without fused multiply-add, 16 lanes) give other bits for most of these lengths here (checked
// with a standalone program against LibTorch 1.13 on an AMD EPYC: AVX2 dispatch, 8 lanes with FMA match).
TEST(Parallelism, TheStreamedNormIsLibTorchsNormBitForBit) {
  auto s = NormStream::matching_torch(0);
  ASSERT_TRUE(s) << "no variant matches this LibTorch's norm kernel";
  std::mt19937 gen(3);
  for (int64_t n : {1, 9, 31, 4096, 77777, 300001}) {
    torch::manual_seed(n);
    auto t = torch::randn({n}) * (n % 2 ? 0.01 : 3.0);
    s->reset(n);
    for (int64_t at = 0; at < n;) {
      const int64_t k = std::min<int64_t>(n - at, 1 + gen() % 5000);
      s->add(t.data_ptr<float>() + at, k);
      at += k;
    }
    const float mine = s->result(), theirs = t.norm().item<float>();
    EXPECT_EQ(std::memcmp(&mine, &theirs, sizeof(float)), 0) << "n " << n << ": " << mine << " vs " << theirs;
  }
}

// One process without a group: the optimizer owns everything, its state is replicated (rank 0 saves
// it), and the hooks of the seam do nothing (the single-process step is the one before the seam).
TEST(Parallelism, OneProcessOwnsEverythingAndHooksNothing) {
  torch::nn::Linear lin(4, 3);
  FlatParams flat(*lin);
  DistConfig dist;
  dist.zero = 1;  // no group: nothing to shard whatever dist.zero says
  auto par = make_parallelism({dist, nullptr, flat, *lin, 0, 1});
  EXPECT_FALSE(par->optimizer_ranges().has_value());
  EXPECT_FALSE(par->shards_optimizer());
  EXPECT_FALSE(par->grad_norm(1).defined());
  EXPECT_NE(par->describe(96, "the AdamW moments").find("optimizer state 0.0 MB: the AdamW moments of every weight"),
            std::string::npos);
}

// ---- the layout ---------------------------------------------------------------------------------

TEST(ZeroLayout, PiecesCoverEveryBucketOnceTheLastRankTakesWhatIsLeft) {
  for (int world = 1; world <= 5; ++world) {
    ZeroLayout l{{{0, 10}, {10, 3}, {13, 1}, {14, 64}}, 0, world};
    for (size_t b = 0; b < l.buckets.size(); ++b) {
      int64_t at = l.buckets[b].offset;
      for (int r = 0; r < world; ++r) {
        const auto p = l.piece(b, r);
        EXPECT_EQ(p.offset, at) << "world " << world << " bucket " << b << " rank " << r;
        EXPECT_EQ(p.numel, r == world - 1 ? l.buckets[b].numel - (world - 1) * (l.buckets[b].numel / world)
                                          : l.buckets[b].numel / world);
        at += p.numel;
      }
      EXPECT_EQ(at, l.buckets[b].offset + l.buckets[b].numel);
    }
    int64_t owned = 0;
    for (int r = 0; r < world; ++r) owned += ZeroLayout{l.buckets, r, world}.owned_numel();
    EXPECT_EQ(owned, 78) << "world " << world;
  }
}

// ---- the sharded AdamW --------------------------------------------------------------------------

// A small model with decayed matrices and undecayed biases, norms and an embedding, the same
// weights for every seed-1 build.
torch::nn::Sequential small_model() {
  torch::manual_seed(1);
  return torch::nn::Sequential(torch::nn::Embedding(11, 6), torch::nn::Linear(6, 7), torch::nn::LayerNorm(
                                   torch::nn::LayerNormOptions({7})), torch::nn::Linear(7, 5));
}

OptimConfig adamw_config() {
  OptimConfig c;
  c.weight_decay = 0.1;
  c.fused = "off";
  return c;
}

// The gradients of step k, the same for every replica.
torch::Tensor grads_of(int64_t numel, int k) {
  torch::manual_seed(100 + k);
  return torch::randn({numel});
}

struct Replica {
  torch::nn::Sequential model = small_model();
  std::unique_ptr<FlatParams> flat = std::make_unique<FlatParams>(*model);
  std::unique_ptr<AdamW> opt;
};

std::unique_ptr<Replica> replica(std::optional<ZeroLayout> layout) {
  auto r = std::make_unique<Replica>();
  r->opt = std::make_unique<AdamW>(*r->flat, adamw_config(),
                                   layout ? std::make_optional(layout->owned()) : std::nullopt);
  return r;
}

// Runs `steps` updates with the same gradients on the whole-buffer AdamW and on `world` sharded
// ones (each owning its pieces of 40-value buckets), and returns them.
std::pair<std::unique_ptr<Replica>, std::vector<std::unique_ptr<Replica>>> train_both(int world, int steps) {
  auto whole = replica(std::nullopt);
  const auto buckets = plan_buckets(*whole->flat, 40 * 4 / 1e6);
  EXPECT_GT(buckets.size(), 3u);
  std::vector<std::unique_ptr<Replica>> shards;
  for (int r = 0; r < world; ++r) shards.push_back(replica(ZeroLayout{buckets, r, world}));
  for (int k = 0; k < steps; ++k) {
    const auto g = grads_of(whole->flat->numel(), k);
    whole->flat->grads().copy_(g);
    whole->opt->step(1e-2);
    for (auto& s : shards) {
      s->flat->grads().copy_(g);
      s->opt->step(1e-2);
    }
  }
  return {std::move(whole), std::move(shards)};
}

TEST(ZeroAdamW, EachRankSteppingItsPiecesGivesTheWholeBuffersBits) {
  for (int world : {2, 3}) {
    auto [whole, shards] = train_both(world, 4);
    const auto buckets = plan_buckets(*whole->flat, 40 * 4 / 1e6);
    int64_t state = 0;
    for (int r = 0; r < world; ++r) {
      const ZeroLayout l{buckets, r, world};
      EXPECT_EQ(shards[r]->opt->state_bytes(), 2 * 4 * l.owned_numel());
      int64_t at = 0;
      for (const auto& p : l.owned()) {
        // The owned values of the weights and of both moments: the whole buffer's, bit for bit.
        EXPECT_TRUE(torch::equal(shards[r]->flat->params().narrow(0, p.offset, p.numel),
                                 whole->flat->params().narrow(0, p.offset, p.numel)))
            << "world " << world << " rank " << r;
        EXPECT_TRUE(torch::equal(shards[r]->opt->exp_avg().narrow(0, at, p.numel),
                                 whole->opt->exp_avg().narrow(0, p.offset, p.numel)));
        EXPECT_TRUE(torch::equal(shards[r]->opt->exp_avg_sq().narrow(0, at, p.numel),
                                 whole->opt->exp_avg_sq().narrow(0, p.offset, p.numel)));
        at += p.numel;
      }
      state += at;
    }
    EXPECT_EQ(state, whole->flat->numel());
  }
}

// Gradients in pieces (ZeRO-2): the sharded AdamW reads them packed as its moments and gives the
// whole buffer's bits.
TEST(ZeroAdamW, GradientsInPiecesGiveTheWholeBuffersBits) {
  const int world = 3, steps = 3;
  auto whole = replica(std::nullopt);
  const auto buckets = plan_buckets(*whole->flat, 40 * 4 / 1e6);
  for (int r = 0; r < world; ++r) {
    const ZeroLayout l{buckets, r, world};
    auto model = small_model();
    GradPath path;
    path.pieces = true;
    FlatParams flat(*model, path);
    EXPECT_THROW(flat.grads(), c10::Error) << "no flat gradient buffer";
    flat.keep_grad_pieces(l.owned());
    EXPECT_EQ(flat.grad_pieces().numel(), l.owned_numel());
    AdamW opt(flat, adamw_config(), l.owned());
    auto ref = replica(std::nullopt);
    for (int k = 0; k < steps; ++k) {
      const auto g = grads_of(flat.numel(), k);
      ref->flat->grads().copy_(g);
      clip_grad_norm(*ref->flat, 0.5);
      ref->opt->step(1e-2);
      int64_t at = 0;
      for (const auto& p : l.owned()) flat.grad_pieces().narrow(0, at, p.numel).copy_(g.narrow(0, p.offset, p.numel)), at += p.numel;
      clip_grad_norm(flat, 0.5, g.norm());
      opt.step(1e-2);
    }
    for (const auto& p : l.owned())
      EXPECT_TRUE(torch::equal(flat.params().narrow(0, p.offset, p.numel), ref->flat->params().narrow(0, p.offset, p.numel)))
          << "rank " << r;
  }
}

// Every rank's state() as the shards a checkpoint hands back.
ComponentState as_parts(const std::vector<std::unique_ptr<Replica>>& shards) {
  ComponentState st;
  st.values = shards[0]->opt->state().values;
  for (auto& s : shards) {
    NamedTensors part;
    for (auto& [name, t] : s->opt->state().tensors) part.emplace_back(name, t.clone());
    st.shards.push_back([part] { return part; });
  }
  return st;
}

TEST(ZeroAdamW, StateSavedAtOneWorldSizeLoadsAtAnother) {
  auto [whole, shards3] = train_both(3, 3);
  const auto buckets = plan_buckets(*whole->flat, 40 * 4 / 1e6);
  const ComponentState parts = as_parts(shards3);
  EXPECT_NE(shards3[1]->opt->state().tensors[0].first.find("["), std::string::npos) << "sliced names";
  // Three parts into the whole-buffer AdamW: its moments exactly.
  auto one = replica(std::nullopt);
  one->opt->load_state(&parts);
  EXPECT_TRUE(torch::equal(one->opt->exp_avg(), whole->opt->exp_avg()));
  EXPECT_TRUE(torch::equal(one->opt->exp_avg_sq(), whole->opt->exp_avg_sq()));
  EXPECT_EQ(one->opt->steps(), 3);
  // Three parts into two ranks, and the whole state into two ranks: the owned values of both.
  const ComponentState whole_state = whole->opt->state();
  for (const ComponentState* from : {&parts, &whole_state}) {
    for (int r = 0; r < 2; ++r) {
      const ZeroLayout l{buckets, r, 2};
      auto two = replica(l);
      two->opt->load_state(from);
      int64_t at = 0;
      for (const auto& p : l.owned()) {
        EXPECT_TRUE(torch::equal(two->opt->exp_avg().narrow(0, at, p.numel), whole->opt->exp_avg().narrow(0, p.offset, p.numel)));
        EXPECT_TRUE(torch::equal(two->opt->exp_avg_sq().narrow(0, at, p.numel),
                                 whole->opt->exp_avg_sq().narrow(0, p.offset, p.numel)));
        at += p.numel;
      }
    }
  }
  // A part missing: refused, naming what is not covered.
  ComponentState missing = parts;
  missing.shards.pop_back();
  auto again = replica(std::nullopt);
  try {
    again->opt->load_state(&missing);
    ADD_FAILURE() << "no CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("expected (a part missing"), std::string::npos) << e.what();
  }
  // A slice that does not fit its parameter: refused, naming it.
  ComponentState bad;
  bad.values = parts.values;
  bad.tensors = {{"exp_avg/1.weight[0:99]", torch::zeros({99})}};
  try {
    again->opt->load_state(&bad);
    ADD_FAILURE() << "no CheckpointError";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("exp_avg/1.weight[0:99]"), std::string::npos) << e.what();
  }
}

// ---- real Gloo groups of trainers ---------------------------------------------------------------

class ZeroE2E : public ::testing::Test {
 protected:
  const std::string data_ = test::shared_bytes_dataset();

  std::vector<std::string> args(const std::string& run, std::vector<std::string> extra) const {
    std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + data_, "run.dir=" + run,
                                  "log.every_steps=1", "eval.batches=0", "train.threads=1", "dist.bucket_mb=0.05",
                                  "model.dropout=0.1", "dist.timeout_s=30"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // `world` trainer processes (world 1: no launcher variables); every exit code.
  std::vector<int> run(const std::string& dir, int world, std::vector<std::string> extra,
                       const std::vector<std::string>& env_all = {}, const std::string& env_rank1 = "") const {
    const int port = test::free_port();
    std::vector<test::Proc> ranks;
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> env = test::rank_env(r, world, port);
      env.insert(env.end(), env_all.begin(), env_all.end());
      if (r == 1 && !env_rank1.empty()) env.push_back(env_rank1);
      fs::create_directories(dir);
      ranks.push_back(test::spawn_bin("trainer", args(dir, extra), dir + "/out" + std::to_string(r) + "_" +
                                      std::to_string(::getpid()) + "_" + std::to_string(counter_++), env));
    }
    std::vector<int> codes;
    for (auto& r : ranks) codes.push_back(test::wait_proc(r, 240));
    return codes;
  }
  void run_ok(const std::string& dir, int world, std::vector<std::string> extra, const std::vector<std::string>& env = {}) const {
    const auto codes = run(dir, world, extra, env);
    for (size_t r = 0; r < codes.size(); ++r) ASSERT_EQ(codes[r], 0) << "rank " << r << "\n" << test::read_text(dir + "/logs/rank_" + std::to_string(r) + ".log");
  }
  static std::vector<std::pair<double, double>> loss_and_norm(const std::string& dir) {
    std::vector<std::pair<double, double>> out;
    for (auto& l : test::metrics_of_kind(dir + "/metrics.jsonl", "train")) {
      const auto j = nlohmann::json::parse(l);
      out.emplace_back(j["loss"].get<double>(), j["grad_norm"].get<double>());
    }
    return out;
  }
  mutable int counter_ = 0;
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
std::vector<std::string> losses_as_text(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& l : test::metrics_of_kind(dir + "/metrics.jsonl", "train")) {
    const auto j = nlohmann::json::parse(l);
    out.push_back(j["loss"].dump() + " " + j["grad_norm"].dump());
  }
  return out;
}

// The run's EMA tensors at the last checkpoint, bit for bit.
void expect_same_ema(const std::string& a, const std::string& b, int64_t step) {
  char name[48];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08lld/ema.safetensors", static_cast<long long>(step));
  auto ea = load_safetensors(a + name), eb = load_safetensors(b + name);
  ASSERT_EQ(ea.size(), eb.size());
  for (size_t i = 0; i < ea.size(); ++i) EXPECT_TRUE(torch::equal(ea[i].second, eb[i].second)) << ea[i].first;
}

// dist.zero: 2 against plain data parallelism at the same world size over Gloo: every step's loss
// and grad norm, the final weights and the EMA bit for bit, with clipping (grad_clip 0.05
// clips every step), a non-finite step skipped (LM_FAULT_NAN_STEP), the EMA; at 2 ranks GPT with
// dropout, gradient accumulation and activation checkpointing, at 4 ranks Llama (GQA, untied head;
// it has no dropout). Checked
// to fail with the norm taken from the pieces' sums of squares (NormStream not used): at 2 ranks
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
    EXPECT_NE(log1.find("streamed as LibTorch's kernel adds it"), std::string::npos) << log1;
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
