// A deferred build (models/build.h build_model_deferred) placed by FlatParams: every parameter a
// placeholder (no memory) until init_weights writes it, each rank copying only the ranges it keeps;
// the values are build_model's, bit for bit, for GPT and Llama (tied and untied heads), whatever
// ranges a rank keeps. Checked to fail with GPT's blocks left whole (not made placeholders), with
// the scratch drawn twice (LMImpl::draw: the values drift from build_model's), with FlatParams::write
// ignoring the kept ranges, and with pending_names() naming nothing.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <limits>
#include <vector>

#include "models/build.h"
#include "tests/testutil.h"
#include "trainer/optim/flat_params.h"

namespace lm {
namespace {

std::vector<ModelConfig> shapes() {
  auto gpt = test::tiny_model();
  auto llama = test::tiny_llama_model();
  auto tied = llama;
  tied.tie_embeddings = true;
  return {gpt, llama, tied};
}

// build_model's weights laid out as FlatParams lays them out.
torch::Tensor reference_flat(const ModelConfig& c) {
  torch::manual_seed(7);
  LM whole = build_model(c, 64);
  FlatParams flat(*whole);
  return flat.params().clone();
}

TEST(DeferredBuild, PlaceholdersHoldNoMemoryAndInitGivesBuildModelsValues) {
  for (const auto& c : shapes()) {
    SCOPED_TRACE(c.arch + (c.tie_embeddings ? " tied" : ""));
    const auto want = reference_flat(c);
    torch::manual_seed(7);
    LM m = build_model_deferred(c, 64, torch::kCPU);
    for (const auto& p : m->parameters()) {
      ASSERT_TRUE(is_placeholder(p));
      EXPECT_LE(p.storage().nbytes(), sizeof(float));  // one zero, expanded
      EXPECT_TRUE(p.requires_grad());
    }
    FlatParams flat(*m);
    EXPECT_TRUE(flat.values_pending());
    m->init_weights([&](const torch::Tensor& p, const torch::Tensor& v) { flat.write(p, v); });
    EXPECT_FALSE(flat.values_pending());
    EXPECT_TRUE(torch::equal(flat.params(), want));
    for (const auto& p : m->parameters()) EXPECT_FALSE(is_placeholder(p));
  }
}

// Two "ranks" each keep ranges cut inside parameters: each writes only its own (the rest of its
// buffer untouched: here filled with NaN first), and together they hold build_model's values.
TEST(DeferredBuild, EachRankWritesOnlyTheRangesItKeeps) {
  for (const auto& c : shapes()) {
    SCOPED_TRACE(c.arch + (c.tie_embeddings ? " tied" : ""));
    const auto want = reference_flat(c);
    const int64_t n = want.numel(), cut1 = n / 3 + 5, cut2 = 2 * n / 3 + 1;
    const std::vector<std::vector<FlatRange>> keeps = {{{0, cut1}, {cut2, n - cut2}}, {{cut1, cut2 - cut1}}};
    for (const auto& keep : keeps) {
      torch::manual_seed(7);
      LM m = build_model_deferred(c, 64, torch::kCPU);
      FlatParams flat(*m);
      flat.params().fill_(std::numeric_limits<float>::quiet_NaN());
      m->init_weights([&](const torch::Tensor& p, const torch::Tensor& v) { flat.write(p, v, &keep); });
      EXPECT_FALSE(flat.values_pending());
      int64_t kept = 0;
      for (const auto& r : keep) {
        EXPECT_TRUE(torch::equal(flat.params().narrow(0, r.offset, r.numel), want.narrow(0, r.offset, r.numel)));
        kept += r.numel;
      }
      EXPECT_EQ(flat.params().isnan().sum().item<int64_t>(), n - kept);  // nothing else written
    }
  }
}

// A parameter init_weights never writes is named (the trainer refuses to start with it).
TEST(DeferredBuild, AnUnwrittenParameterIsNamed) {
  torch::manual_seed(7);
  LM m = build_model_deferred(test::tiny_model(), 64, torch::kCPU);
  FlatParams flat(*m);
  m->init_weights([&](const torch::Tensor& p, const torch::Tensor& v) {
    if (p.dim() != 1) flat.write(p, v);  // the norms and biases left out
  });
  ASSERT_TRUE(flat.values_pending());
  const auto names = flat.pending_names(2);
  ASSERT_EQ(names.size(), 2u);
  EXPECT_NE(names[0].find("bias"), std::string::npos) << names[0];
}

}  // namespace
}  // namespace lm
