// trainer/optim/flat_state.h: the state of buffers laid out as the flat parameters, saved whole or
// as each rank's slices, reads back whole from either, whatever cut the saving run made; a missing
// part, a malformed or misfit slice is refused naming it.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <memory>
#include <string>

#include "common/errors.h"
#include "trainer/optim/flat_params.h"
#include "trainer/optim/flat_state.h"

namespace lm {
namespace {

struct Net : torch::nn::Module {
  Net() {
    a = register_module("a", torch::nn::Linear(5, 3));
    b = register_module("b", torch::nn::Linear(3, 7));
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

// Two "ranks" save their ranges (cut inside parameters, ranges that are not the parameters' edges),
// a third cut is read back into a zeroed buffer from the parts one at a time: the same values.
// Checked to fail with each slice's values copied reversed (copy_flat_slice).
TEST(FlatState, PartsOfAnyCutReadBackWhole) {
  auto net = std::make_shared<Net>();
  FlatParams flat(*net);
  const int64_t n = flat.numel();
  const auto values = torch::arange(n, torch::kFloat);
  const std::vector<std::vector<FlatRange>> ranks = {{{0, 7}, {20, 9}}, {{7, 13}, {29, n - 29}}};
  std::vector<NamedTensors> parts;
  for (const auto& ranges : ranks) {
    parts.push_back(flat_slices(flat, ranges, values, "", /*indexed=*/true));
    for (auto& [name, t] : parts.back()) EXPECT_NE(name.find('['), std::string::npos) << name;
  }
  ComponentState st;
  for (auto& p : parts) st.shards.push_back([p] { return p; });
  auto back = torch::zeros({n});
  load_flat_values(flat, back, st, "ema state");
  EXPECT_TRUE(torch::equal(back, values));
  // Packed (the sharded moments): the ranges' values one after another, the same names.
  const std::vector<FlatRange> r = {{3, 4}, {30, 5}};
  const auto packed = torch::cat({values.narrow(0, 3, 4), values.narrow(0, 30, 5)});
  const auto a = flat_slices(flat, r, packed, "exp_avg/"), b = flat_slices(flat, r, values, "exp_avg/", true);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second));
  }
}

TEST(FlatState, AMissingPartOrABadSliceIsRefusedNamingIt) {
  auto net = std::make_shared<Net>();
  FlatParams flat(*net);
  const int64_t n = flat.numel();
  const auto values = torch::arange(n, torch::kFloat);
  auto back = torch::zeros({n});
  ComponentState half;
  half.tensors = flat_slices(flat, {{0, n / 2}}, values, "", true);
  try {
    load_flat_values(flat, back, half, "ckpt/model");
    FAIL() << "a missing part was taken";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("ckpt/model: " + std::to_string(n / 2) + " values from the checkpoint for " +
                                         std::to_string(n) + " weights"),
              std::string::npos)
        << e.what();
  }
  const auto& first = flat.entries().front();
  for (const std::string& bad : {first.name + "[0:2", first.name + "[1:x]", std::string("nope[0:1]")}) {
    ComponentState st;
    st.tensors = {{bad, torch::zeros({1})}};
    try {
      load_flat_values(flat, back, st, "ckpt/ema");
      FAIL() << bad;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + bad + "'"), std::string::npos) << e.what();
    }
  }
  ComponentState misfit;
  misfit.tensors = {{first.name + "[0:3]", torch::zeros({2})}};
  EXPECT_THROW(load_flat_values(flat, back, misfit, "ckpt/ema"), CheckpointError);
}

}  // namespace
}  // namespace lm
