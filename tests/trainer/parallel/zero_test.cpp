// The parallelism seam's table and ZeRO's pieces in one process: the strategy and the bytes a rank
// keeps per stage, the layout, the sharded AdamW against the whole-buffer one (gradients whole or in
// pieces), its state resharded across world sizes, the streamed norm. Real groups: zero_e2e_test.cpp.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "common/errors.h"
#include "common/torch/compat.h"
#include "tests/testutil.h"
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
    EXPECT_DOUBLE_EQ(b.grads, 4 * n / world + (PieceReduction::kInFlight + 1) * 1e6) << "world " << world;
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

// ZeRO-3's row: its pieces of the weights, of the gradients (ZeRO-2's, buckets in flight beside
// them) and of the optimizer state: about 16N/W of model state per rank.
TEST(Parallelism, ZeroThreeKeepsItsPiecesOfWeightsGradientsAndMoments) {
  const double n = 4e7, adamw = 8;
  DistConfig z3;
  z3.zero = 3;
  z3.bucket_mb = 1;
  for (int world : {2, 4}) {
    const RankBytes b = rank_bytes(z3, world, n, adamw);
    EXPECT_DOUBLE_EQ(b.weights, 4 * n / world);
    EXPECT_DOUBLE_EQ(b.grads, 4 * n / world + (PieceReduction::kInFlight + 1) * 1e6) << "world " << world;
    EXPECT_DOUBLE_EQ(b.optimizer, 8 * n / world);
    EXPECT_NE(b.stage.find("dist.zero=3 at " + std::to_string(world) + " ranks (weights, gradients and optimizer"),
              std::string::npos) << b.stage;
    EXPECT_TRUE(grads_in_pieces(z3, world, true));
  }
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

}  // namespace
}  // namespace lm
