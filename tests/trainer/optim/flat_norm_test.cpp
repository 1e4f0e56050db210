// FlatNorm (trainer/optim/flat_norm.h): the CPU gradient norm every parallelism reproduces. Fed in
// any cut of increasing ranges, with ranges of zeros left out, and taken whole at any thread count,
// it gives the same bits; it is the L2 norm within float rounding; fed out of order it refuses.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <random>

#include "trainer/optim/flat_norm.h"
#include "trainer/optim/flat_params.h"

namespace lm {
namespace {

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Lengths around the chunk and lane edges, and over several chunks. The sums of squares are compared
// (in double): the float norm rounds most differences in the order of adding away. Checked to fail
// with the streamed lanes indexed by the position in the range instead of the offset in the vector.
TEST(FlatNorm, AnyCutAnyThreadCountTheSameBits) {
  const int64_t C = FlatNorm::kChunk;
  std::mt19937 gen(7);
  const int threads = at::get_num_threads();
  for (int64_t n : {int64_t{1}, int64_t{9}, int64_t{31}, C - 3, C, C + 1, 3 * C + 17, int64_t{300001}}) {
    torch::manual_seed(n);
    auto t = torch::randn({n}) * (n % 2 ? 0.01 : 3.0);
    // Zeros in some ranges: a feed that leaves them out gives the same bits.
    if (n > 1000) t.narrow(0, n / 3, n / 5).zero_();
    at::set_num_threads(1);
    const double one = FlatNorm::squares_of(t);
    at::set_num_threads(2);
    const double two = FlatNorm::squares_of(t);
    at::set_num_threads(threads);
    EXPECT_TRUE(same_bits(one, two)) << "n " << n;
    EXPECT_TRUE(same_bits(FlatNorm::of(t), static_cast<float>(std::sqrt(one))));
    for (int trial = 0; trial < 4; ++trial) {
      FlatNorm s;
      s.reset();
      const float* x = t.data_ptr<float>();
      for (int64_t at = 0; at < n;) {
        const int64_t k = std::min<int64_t>(n - at, 1 + gen() % (trial % 2 ? 5000 : 70000));
        bool all_zero = true;
        for (int64_t i = at; i < at + k && all_zero; ++i) all_zero = x[i] == 0.f;
        if (!all_zero || trial < 2) s.add(at, x + at, k);  // trials 2, 3 leave zero ranges out
        at += k;
      }
      EXPECT_TRUE(same_bits(s.squares(), one)) << "n " << n << " trial " << trial << ": " << s.squares() << " vs " << one;
      EXPECT_TRUE(same_bits(s.result(), FlatNorm::of(t)));
    }
    double ref = 0;
    const float* v = t.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) ref += static_cast<double>(v[i]) * v[i];
    EXPECT_NEAR(one, ref, 1e-12 * ref) << "n " << n;
    EXPECT_NEAR(FlatNorm::of(t), t.norm().item<float>(), 1e-5 * std::sqrt(ref)) << "n " << n;
  }
}

TEST(FlatNorm, NonFiniteValuesGiveANonFiniteNorm) {
  auto t = torch::ones({1000});
  t[517] = std::nanf("");
  EXPECT_TRUE(std::isnan(FlatNorm::of(t)));
  t[517] = INFINITY;
  EXPECT_TRUE(std::isinf(FlatNorm::of(t)));
}

TEST(FlatNorm, RangesOutOfOrderAreRefused) {
  std::vector<float> x(100, 1.f);
  FlatNorm s;
  s.reset();
  s.add(50, x.data(), 50);
  EXPECT_THROW(s.add(10, x.data(), 5), c10::Error);
}

// The flat path's norm (plain data parallelism, ZeRO-1, one process) is FlatNorm's over the flat
// gradient buffer.
TEST(FlatNorm, IsTheFlatPathsGradientNorm) {
  torch::nn::Linear lin(70, 300);
  FlatParams flat(*lin);
  lin->forward(torch::randn({4, 70})).pow(2).sum().backward();
  const float mine = flat_grad_norm(flat).item<float>();
  EXPECT_TRUE(same_bits(mine, FlatNorm::of(flat.grads())));
  EXPECT_NEAR(mine, flat.grads().norm().item<float>(), 1e-5 * mine);
}

}  // namespace
}  // namespace lm
