// The gpt model, flat parameters, AdamW, the LR schedule, safetensors and sampling.
#include <gtest/gtest.h>

#include "common/test_hooks.h"
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <limits>

#include "common/torch/compat.h"
#include "models/attention.h"
#include "models/build.h"
#include "models/cpu_kernels.h"
#include "models/gpt.h"
#include "tests/testutil.h"
#include "common/errors.h"
#include "common/files.h"
#include "trainer/generate/generate.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/schedule.h"
#include "trainer/checkpoint/safetensors.h"

namespace lm {
namespace {

using test::tiny_model;

TEST(Model, Gpt2SmallHasExactly124475904Parameters) {
  ModelConfig c;
  c.n_layer = 12;
  c.n_head = 12;
  c.d_model = 768;
  c.seq_len = 1024;
  EXPECT_EQ(padded_vocab(c, 50257), 50304);
  GPT m(c, padded_vocab(c, 50257));
  EXPECT_EQ(m->num_params(), 124475904);
}

TEST(Model, VocabPaddedToMultiple) {
  ModelConfig c;
  EXPECT_EQ(padded_vocab(c, 258), 320);
  EXPECT_EQ(padded_vocab(c, 4096), 4096);
  c.vocab_size = 5000;
  EXPECT_EQ(padded_vocab(c, 258), 5056);
}

TEST(Model, OutputShapesAndInitialLoss) {
  torch::manual_seed(0);
  auto c = tiny_model();
  GPT m(c, 64);
  auto idx = torch::randint(0, 64, {3, 16}, torch::kLong);
  auto logits = m->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 16, 64}));
  auto loss = m->loss(idx, torch::randint(0, 64, {3, 16}, torch::kLong)).item<double>();
  EXPECT_NEAR(loss, std::log(64.0), 0.3);  // small init: near-uniform predictions
  // Shorter sequences work; longer than seq_len are refused.
  EXPECT_EQ(m->forward(idx.slice(1, 0, 5)).size(1), 5);
  EXPECT_THROW(m->forward(torch::zeros({1, 17}, torch::kLong)), c10::Error);
}

TEST(Model, HeadIsTiedAndTargetsMinusOneIgnored) {
  torch::manual_seed(0);
  GPT m(tiny_model(), 64);
  for (auto& p : m->named_parameters()) EXPECT_EQ(p.key().find("head"), std::string::npos);
  auto idx = torch::randint(0, 64, {2, 8}, torch::kLong);
  auto tgt = idx.clone();
  auto full = m->loss(idx, tgt);
  tgt.slice(1, 4, 8).fill_(-1);
  auto half = m->loss(idx, tgt);
  auto logits = m->forward(idx).slice(1, 0, 4).reshape({-1, 64});
  auto ref = torch::nn::functional::cross_entropy(logits, idx.slice(1, 0, 4).reshape({-1}));
  EXPECT_NEAR(half.item<double>(), ref.item<double>(), 1e-5);
  EXPECT_NE(full.item<double>(), half.item<double>());
}

TEST(Model, CausalNoFutureLeak) {
  torch::manual_seed(0);
  GPT m(tiny_model(), 64);
  m->eval();
  auto a = torch::randint(0, 64, {1, 16}, torch::kLong);
  auto b = a.clone();
  b.index_put_({0, 15}, (a.index({0, 15}) + 1) % 64);
  auto la = m->forward(a), lb = m->forward(b);
  EXPECT_TRUE(torch::allclose(la.slice(1, 0, 15), lb.slice(1, 0, 15)));
  EXPECT_FALSE(torch::allclose(la.slice(1, 15, 16), lb.slice(1, 15, 16)));
}

// The fused kernels take the path ATen's capability allows: the portable loops under
// ATEN_CPU_CAPABILITY=default (the `default:` runs of the test command's kernels phase, where every
// test of this file then checks them), the AVX2 path where the CPU has AVX2+FMA otherwise; and the
// kernels phase's oneDNN switch reached this process (tests/kernel_hooks.cpp).
TEST(CpuKernels, FollowAtensCapabilityAndTheKernelSwitch) {
  const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
  const bool portable = cap != nullptr && std::string(cap) == "default";
  const bool cpu_avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_STREQ(cpu_kernels_isa(), portable || !cpu_avx2 ? "portable" : "avx2");
  EXPECT_EQ(at::globalContext().userEnabledMkldnn(), !test_hooks().mkldnn_off);
  std::cerr << "fused CPU kernels: " << cpu_kernels_isa() << ", ATEN_CPU_CAPABILITY " << (cap ? cap : "(unset)")
            << ", oneDNN " << (at::globalContext().userEnabledMkldnn() ? "on" : "off") << "\n";
}

// The fused GELU against LibTorch's gelu(x, "tanh") in double precision: forward and backward no
// further from it than float rounding, and never much worse than LibTorch's own float kernel.
TEST(Gelu, MatchesTheTanhGeluForwardAndBackward) {
  torch::manual_seed(0);
  auto x = torch::cat({torch::linspace(-12, 12, 100003), torch::randn({4099}) * 3,
                       torch::tensor({0.f, 1e-20f, -1e-20f, 30.f, -30.f, 88.f, -88.f, 1e4f, -1e4f, 0.5f})});
  auto g = torch::randn_like(x);
  auto x64 = x.to(torch::kDouble).requires_grad_(true);
  auto y64 = torch::gelu(x64, "tanh");
  auto dx64 = torch::autograd::grad({y64}, {x64}, {g.to(torch::kDouble)})[0];
  auto xa = x.clone().requires_grad_(true), xb = x.clone().requires_grad_(true);
  auto ya = torch::gelu(xa, "tanh"), yb = gelu_tanh(xb);
  auto dxa = torch::autograd::grad({ya}, {xa}, {g})[0], dxb = torch::autograd::grad({yb}, {xb}, {g})[0];
  auto err = [](const torch::Tensor& got, const torch::Tensor& ref) {
    return ((got.to(torch::kDouble) - ref.detach()).abs() / (ref.detach().abs() + 1.0)).max().item<double>();
  };
  EXPECT_LT(err(yb, y64), 2e-6);
  EXPECT_LT(err(dxb, dx64), 4e-6);
  EXPECT_LE(err(yb, y64), 4 * err(ya, y64) + 1e-7);
  EXPECT_LE(err(dxb, dx64), 4 * err(dxa, dx64) + 1e-7);
  auto d = torch::randn({7, 5}, torch::kDouble);  // not float32: LibTorch's kernel, exactly
  EXPECT_TRUE(torch::equal(gelu_tanh(d), torch::gelu(d, "tanh")));
  auto t = torch::randn({6, 9}).t();  // not contiguous: the same values as its contiguous copy
  EXPECT_TRUE(torch::equal(gelu_tanh(t), gelu_tanh(t.contiguous())));
}

// An element's value does not depend on where a slice or a thread's range starts (odd lengths,
// starts off the 8-lane grid) nor on the thread count, forward and backward.
TEST(Gelu, ResultDoesNotDependOnSplitOrThreads) {
  torch::manual_seed(1);
  auto x = torch::randn({100003}) * 4, g = torch::randn({100003});
  auto both = [&](const torch::Tensor& xs, const torch::Tensor& gs) {
    auto v = xs.clone().requires_grad_(true);
    auto y = gelu_tanh(v);
    return std::make_pair(y.detach(), torch::autograd::grad({y}, {v}, {gs})[0]);
  };
  const int threads = torch::get_num_threads();
  torch::set_num_threads(1);
  auto [y1, d1] = both(x, g);
  torch::set_num_threads(2);
  auto [y2, d2] = both(x, g);
  torch::set_num_threads(threads);
  EXPECT_TRUE(torch::equal(y1, y2));
  EXPECT_TRUE(torch::equal(d1, d2));
  for (int64_t start : {1, 3, 7, 13}) {
    auto [ys, ds] = both(x.slice(0, start, start + 1001), g.slice(0, start, start + 1001));
    EXPECT_TRUE(torch::equal(ys, y1.slice(0, start, start + 1001))) << start;
    EXPECT_TRUE(torch::equal(ds, d1.slice(0, start, start + 1001))) << start;
  }
}

// The fused loss against LibTorch's cross_entropy(sum, ignore_index -1) in double: the loss and
// every logit's gradient within float rounding; bad targets, NaN logits and all-ignored batches
// as LibTorch has them; the same bits at 1 and 2 threads.
TEST(CrossEntropy, MatchesLibTorchsSummedLossAndGradient) {
  namespace F = torch::nn::functional;
  torch::manual_seed(2);
  const int64_t N = 300, V = 1003;  // V off the 8-lane grid; N spans several threads' ranges
  auto x = torch::randn({N, V}) * 4;
  x.slice(0, 0, 5) += 60;  // rows of large logits
  auto t = torch::randint(0, V, {N}, torch::kLong);
  t.slice(0, 10, 20).fill_(-1);
  auto x64 = x.to(torch::kDouble).requires_grad_(true);
  auto ref = F::cross_entropy(x64, t, F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
  auto ref_grad = torch::autograd::grad({ref}, {x64}, {torch::tensor(0.5, torch::kDouble)})[0];
  auto run = [&](int threads) {
    const int before = torch::get_num_threads();
    torch::set_num_threads(threads);
    auto v = x.clone().requires_grad_(true);
    auto loss = cross_entropy_sum(v, t);
    auto grad = torch::autograd::grad({loss}, {v}, {torch::tensor(0.5f)})[0];
    torch::set_num_threads(before);
    return std::make_pair(loss.detach(), grad);
  };
  auto [loss, grad] = run(1);
  auto xf = x.clone().requires_grad_(true);  // LibTorch's own float kernel, for scale
  auto lf = F::cross_entropy(xf, t, F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum));
  auto gf = torch::autograd::grad({lf}, {xf}, {torch::tensor(0.5f)})[0];
  auto grad_err = [&](const torch::Tensor& g) { return (g.to(torch::kDouble) - ref_grad).abs().max().item<double>(); };
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-6 * ref.item<double>());
  EXPECT_LT(grad_err(grad), 1e-6);
  EXPECT_LE(grad_err(grad), 2 * grad_err(gf) + 1e-8) << grad_err(gf);
  EXPECT_TRUE(torch::equal(grad.slice(0, 10, 20), torch::zeros({10, V})));  // ignored rows
  auto [loss2, grad2] = run(2);
  EXPECT_TRUE(torch::equal(loss, loss2));
  EXPECT_TRUE(torch::equal(grad, grad2));

  auto bad = t.clone();
  bad[7] = V;
  EXPECT_THROW(cross_entropy_sum(x, bad), c10::Error);
  bad[7] = -2;
  EXPECT_THROW(cross_entropy_sum(x, bad), c10::Error);
  auto nan = x.clone();
  nan[3][V - 1] = std::numeric_limits<float>::quiet_NaN();  // in the padded tail of the row
  EXPECT_TRUE(std::isnan(cross_entropy_sum(nan, t).item<float>()));
  EXPECT_EQ(cross_entropy_sum(x, torch::full({N}, -1, torch::kLong)).item<float>(), 0.0f);
  auto d = x.to(torch::kDouble);  // not float32: LibTorch's op
  EXPECT_TRUE(torch::equal(cross_entropy_sum(d, t),
                           F::cross_entropy(d, t, F::CrossEntropyFuncOptions().ignore_index(-1).reduction(torch::kSum))));
}

// The fused attention of packed heads against the split-heads path in double (LibTorch's ops):
// output and the gradient of every q, k, v entry within float rounding; causal (a later position
// never changes an earlier output).
TEST(CausalAttention, FusedPackedHeadsMatchTheSplitHeadsPath) {
  if (!causal_attention_qkv_applies(torch::zeros({1, 1, 3}))) {
    ASSERT_TRUE(compat::kHasSdpa) << "LibTorch 1.13 on CPU must have found BLAS's sgemm_";
    GTEST_SKIP() << "no sgemm_ in this process (LibTorch 2.x uses SDPA instead)";
  }
  torch::manual_seed(3);
  const int64_t B = 2, T = 37, H = 4, hd = 8, C = H * hd;
  auto qkv = torch::randn({B, T, 3 * C});
  auto g = torch::randn({B, T, C});
  auto ref_in = qkv.to(torch::kDouble).requires_grad_(true);
  auto parts = ref_in.split(C, 2);
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, H, hd}).transpose(1, 2); };
  auto ref = causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]), 0.0, true)
                 .transpose(1, 2).contiguous().view({B, T, C});
  auto ref_grad = torch::autograd::grad({ref}, {ref_in}, {g.to(torch::kDouble)})[0];
  auto run = [&](const torch::Tensor& in) {
    auto v = in.clone().requires_grad_(true);
    auto y = causal_attention_qkv(v, H);
    return std::make_pair(y.detach(), torch::autograd::grad({y}, {v}, {g})[0]);
  };
  auto [y, grad] = run(qkv);
  auto err = [](const torch::Tensor& a, const torch::Tensor& b) { return (a.to(torch::kDouble) - b.detach()).abs().max().item<double>(); };
  EXPECT_LT(err(y, ref), 2e-6);
  EXPECT_LT(err(grad, ref_grad), 2e-5);
  auto later = qkv.clone();
  later.slice(1, 20, T) += 1;  // positions 20.. changed: outputs before 20 are the same bits
  EXPECT_TRUE(torch::equal(run(later).first.slice(1, 0, 20), y.slice(1, 0, 20)));
  EXPECT_FALSE(torch::equal(run(later).first.slice(1, 20, T), y.slice(1, 20, T)));
  // The model's path: dropout in training, or a non-float tensor, takes the split-heads path.
  auto d = qkv.to(torch::kDouble);
  EXPECT_FALSE(causal_attention_qkv_applies(d));
  EXPECT_LT(err(causal_self_attention(d, H, 0.0, true), ref), 1e-12);
}

TEST(FlatParams, ViewsGroupsAndGradients) {
  torch::manual_seed(0);
  GPT m(tiny_model(), 64);
  auto before = module_tensors(*m);
  std::vector<torch::Tensor> copies;
  for (auto& [n, t] : before) copies.push_back(t.detach().clone());
  FlatParams flat(*m);
  EXPECT_EQ(flat.numel(), m->num_params());
  int i = 0;
  for (auto& [n, t] : module_tensors(*m)) EXPECT_TRUE(torch::equal(t, copies[i++])) << n;
  int64_t decayed = 0, in_runs = 0, next = 0;
  for (auto& e : flat.entries()) {
    bool matrix = e.name.find("weight") != std::string::npos && e.name.find("ln") == std::string::npos &&
                  e.name.find("wte") == std::string::npos && e.name.find("wpe") == std::string::npos;
    EXPECT_EQ(e.decay, matrix) << e.name;
    EXPECT_EQ(e.offset, next) << e.name;  // contiguous, in reverse registration order
    next += e.numel;
    if (e.decay) decayed += e.numel;
  }
  EXPECT_EQ(flat.entries().front().name, "lnf.bias");
  EXPECT_EQ(flat.entries().back().name, "wte.weight");
  for (auto& r : flat.decay_runs())
    if (r.decay) in_runs += r.numel;
  EXPECT_EQ(decayed, in_runs);
  // Parameters are views of the flat buffer; gradients accumulate into the flat grad buffer.
  flat.params().zero_();
  for (auto& p : m->parameters()) EXPECT_EQ(p.abs().sum().item<double>(), 0.0);
  torch::manual_seed(1);
  GPT m2(tiny_model(), 64);
  FlatParams flat2(*m2);
  auto idx = torch::randint(0, 64, {2, 16}, torch::kLong);
  m2->loss(idx, idx).backward();
  auto g1 = flat2.grads().clone();
  EXPECT_GT(g1.abs().sum().item<double>(), 0.0);
  m2->loss(idx, idx).backward();
  EXPECT_TRUE(torch::allclose(flat2.grads(), 2 * g1, 1e-5, 1e-6));
  flat2.zero_grad();
  for (auto& p : m2->parameters()) EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
}

TEST(Optim, AdamWMatchesLibTorchAdamW) {
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.eps = 1e-3;  // the key bias gets ~1e-10 gradients (softmax ignores it): damp their float noise
  auto run = [&](bool ours) {
    torch::manual_seed(3);
    GPT m(tiny_model(), 64);
    std::unique_ptr<FlatParams> flat;
    std::unique_ptr<AdamW> opt;
    std::unique_ptr<torch::optim::AdamW> ref;
    if (ours) {
      flat = std::make_unique<FlatParams>(*m);
      opt = std::make_unique<AdamW>(*flat, oc);
    } else {
      std::vector<torch::Tensor> decay, rest;
      for (auto& p : m->named_parameters())
        (p.value().dim() >= 2 && p.key().rfind("wte", 0) != 0 && p.key().rfind("wpe", 0) != 0 ? decay : rest)
            .push_back(p.value());
      auto o = torch::optim::AdamWOptions(oc.lr).betas({oc.beta1, oc.beta2}).eps(oc.eps);
      std::vector<torch::optim::OptimizerParamGroup> groups;
      groups.emplace_back(decay, std::make_unique<torch::optim::AdamWOptions>(o.weight_decay(oc.weight_decay)));
      groups.emplace_back(rest, std::make_unique<torch::optim::AdamWOptions>(o.weight_decay(0.0)));
      ref = std::make_unique<torch::optim::AdamW>(groups, o);
    }
    for (int step = 0; step < 5; ++step) {
      auto idx = torch::randint(0, 64, {2, 16}, torch::kLong);
      if (ours) flat->zero_grad(); else ref->zero_grad();
      m->loss(idx, idx).backward();
      if (ours) opt->step(oc.lr); else ref->step();
    }
    return module_tensors(*m);
  };
  auto a = run(true), b = run(false);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::allclose(a[i].second, b[i].second, 1e-4, 1e-6)) << a[i].first;
}

TEST(Optim, ClipScalesToMaxNorm) {
  torch::manual_seed(0);
  GPT m(tiny_model(), 64);
  FlatParams flat(*m);
  flat.grads().fill_(1.0);
  // N ones: every partial sum of squares is an integer below 2^24, exact in any order; the float
  // sqrt rounds once: half an ulp of sqrt(N) ~ 167, 7.6e-6.
  auto norm = clip_grad_norm(flat, 2.0).item<double>();
  EXPECT_NEAR(norm, std::sqrt(static_cast<double>(flat.numel())), 1e-5);
  // Each gradient is now c = 2 / (norm + 1e-6) in float (the 1e-6 is below half an ulp of the norm):
  // the norm's rounding and the quotient's, 3 u (u = 2^-24) of 2.0 at most: 3.6e-7. In double.
  const auto exact_norm = [&] { return flat.grads().to(torch::kDouble).norm().item<double>(); };
  EXPECT_NEAR(exact_norm(), 2.0, 5e-7);
  // The code's own float norm of N equal squares c^2: their roundings do not cancel (the same terms
  // are added again and again), so the error grows with the length of each sequential sum. LibTorch's
  // CPU norm sums in 8 lanes (2.6 on AVX2 and AVX-512 alike: a simulation of 8 sequential lanes gives
  // its bits; 16 to 64 lanes give 1.5 to 1.8e-6 relative too, one sequential sum 2e-4): 1.8e-6
  // relative, 3.7e-6 of 2.0; the bound 2e-5 is five times that (a scalar, one-lane reduction would
  // fail it).
  EXPECT_NEAR(clip_grad_norm(flat, 5.0).item<double>(), 2.0, 2e-5);  // below max: unchanged
  EXPECT_NEAR(exact_norm(), 2.0, 5e-7);
}

TEST(Optim, Schedule) {
  ScheduleConfig s;
  s.warmup_steps = 10;
  s.min_lr_ratio = 0.1;
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 110, 0), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 110, 9), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 110, 10), 1.0);
  EXPECT_NEAR(lr_at(s, 1.0, 110, 60), 0.55, 1e-12);  // cosine midpoint
  EXPECT_NEAR(lr_at(s, 1.0, 110, 110), 0.1, 1e-12);
  s.kind = "linear";
  EXPECT_NEAR(lr_at(s, 1.0, 110, 35), 1.0 - 0.9 * 0.25, 1e-12);
  s.kind = "constant";
  EXPECT_DOUBLE_EQ(lr_at(s, 1.0, 110, 100), 1.0);
}

// wsd at every phase: warmup 10, max_steps 100, a 20-step decay (steps 80-100) to 0.1; the shapes
// at a quarter, half and three quarters of the decay; the floor at and past its end; the same
// window from decay_fraction 0.2; an anneal stage's start, with and without a length (a floor
// inside the run). Closed forms: p = (step - 80) / 20.
// Checked to fail with 1-sqrt computed as sqrt(1 - p).
TEST(Optim, WsdSchedulePhases) {
  ScheduleConfig s;
  s.kind = "wsd", s.warmup_steps = 10, s.min_lr_ratio = 0.1, s.decay_steps = 20;
  const auto lr = [&](int64_t step) { return lr_at(s, 2.0, 100, step); };
  EXPECT_DOUBLE_EQ(lr(0), 0.2);  // warmup: 2 x (step + 1) / 10
  EXPECT_DOUBLE_EQ(lr(4), 1.0);
  EXPECT_DOUBLE_EQ(lr(9), 2.0);
  for (int64_t step : {10, 45, 79}) EXPECT_DOUBLE_EQ(lr(step), 2.0) << "stable at " << step;
  EXPECT_DOUBLE_EQ(lr(80), 2.0);  // the decay's first step: p = 0
  const double lo = 0.2, span = 1.8;
  EXPECT_NEAR(lr(85), lo + span * 0.75, 1e-12);  // linear: 1 - p
  EXPECT_NEAR(lr(90), lo + span * 0.5, 1e-12);
  EXPECT_NEAR(lr(99), lo + span * 0.05, 1e-12);
  for (int64_t step : {100, 101, 1000}) EXPECT_DOUBLE_EQ(lr(step), lo) << "floor at " << step;
  s.decay_shape = "1-sqrt";
  EXPECT_DOUBLE_EQ(lr(80), 2.0);
  EXPECT_NEAR(lr(85), lo + span * 0.5, 1e-12);  // 1 - sqrt(1/4)
  EXPECT_NEAR(lr(89), lo + span * (1 - std::sqrt(0.45)), 1e-12);
  EXPECT_NEAR(lr(95), lo + span * (1 - std::sqrt(0.75)), 1e-12);
  EXPECT_DOUBLE_EQ(lr(100), lo);
  EXPECT_DOUBLE_EQ(lr(79), 2.0);
  s.decay_shape = "cosine";
  EXPECT_NEAR(lr(90), lo + span * 0.5, 1e-12);
  EXPECT_NEAR(lr(85), lo + span * 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);
  s.decay_shape = "linear", s.decay_steps = 0, s.decay_fraction = 0.2;  // 0.2 x 100 = the same 20 steps
  EXPECT_EQ(wsd_decay_window(s, 100).start, 80);
  EXPECT_EQ(wsd_decay_window(s, 100).end, 100);
  EXPECT_NEAR(lr(90), lo + span * 0.5, 1e-12);
  EXPECT_EQ(wsd_decay_window(s, 33).start, 26);  // round(6.6) = 7 steps
  s.decay_fraction = 0, s.anneal_start = 60;  // an anneal stage at step 60, no length: to max_steps
  EXPECT_DOUBLE_EQ(lr(59), 2.0);
  EXPECT_DOUBLE_EQ(lr(60), 2.0);
  EXPECT_NEAR(lr(80), lo + span * 0.5, 1e-12);
  s.decay_steps = 20;  // and with a length: steps 60-80, the floor from 80 to the end
  EXPECT_NEAR(lr(70), lo + span * 0.5, 1e-12);
  EXPECT_DOUBLE_EQ(lr(80), lo);
  EXPECT_DOUBLE_EQ(lr(99), lo);
}

// A wsd run resumed with a later train.max_steps (continual pretraining): from a checkpoint before
// both decays it is allowed, the new decay runs, and record() says what moved; from a checkpoint in
// the old decay, or past the new decay's start, it is refused (the lr would jump).
// Checked to fail with the refusal in LrSchedule::load_state removed.
TEST(Optim, WsdResumeWithAMovedDecay) {
  ScheduleConfig s;
  s.kind = "wsd", s.warmup_steps = 10, s.decay_steps = 20;
  int64_t done = 0;
  LrSchedule old_run(s, 1.0, 100, &done);  // decay 80-100
  auto state_at = [&](int64_t step) {
    done = step;
    return old_run.state();
  };
  EXPECT_EQ(state_at(80).values["decay_start"], 80);
  EXPECT_EQ(state_at(80).values["decay_end"], 100);
  for (int64_t at : {50, 80}) {  // 80: the stable phase finished, the decay not begun
    LrSchedule longer(s, 1.0, 200, &done);  // decay 180-200
    const auto st = state_at(at);
    EXPECT_NO_THROW(longer.load_state(&st)) << at;
    const auto rec = longer.record();
    EXPECT_EQ(rec["decay_start"], 180);
    EXPECT_EQ(rec["decay_end"], 200);
    EXPECT_EQ(rec["decay_shape"], "linear");
    EXPECT_EQ(rec["decay_moved"]["resumed_at_step"], at);
    EXPECT_EQ(rec["decay_moved"]["was_decay_start"], 80);
    EXPECT_EQ(rec["decay_moved"]["was_decay_end"], 100);
    EXPECT_DOUBLE_EQ(longer.at(90), 1.0);  // stable where the old run decayed
    EXPECT_NEAR(longer.at(190), 0.1 + 0.9 * 0.5, 1e-12);
  }
  {  // a checkpoint inside the old decay
    LrSchedule longer(s, 1.0, 200, &done);
    const auto st = state_at(81);
    EXPECT_THROW(longer.load_state(&st), ConfigError);
  }
  {  // the new decay would start before the checkpoint: 40 steps ending at 100 start at 60
    ScheduleConfig t = s;
    t.decay_steps = 40;
    LrSchedule earlier(t, 1.0, 100, &done);
    const auto st = state_at(70);
    try {
      earlier.load_state(&st);
      ADD_FAILURE() << "resumed";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("steps 80-100 -> 60-100"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("at or before step 60"), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << "one line";
    }
  }
  {  // the same decay: nothing moved, nothing recorded
    LrSchedule same(s, 1.0, 100, &done);
    const auto st = state_at(90);
    EXPECT_NO_THROW(same.load_state(&st));
    EXPECT_FALSE(same.record().contains("decay_moved"));
  }
  {  // the non-wsd record: cosine's decay from the warmup's end to max_steps
    ScheduleConfig c;
    LrSchedule cosine(c, 1.0, 100, &done);
    EXPECT_EQ(cosine.record()["decay_start"], 100);  // the default warmup_steps: 100
    EXPECT_EQ(cosine.record()["decay_end"], 100);
    EXPECT_EQ(cosine.state().values.count("decay_start"), 0u) << "non-wsd state unchanged";
  }
}

TEST(Safetensors, RoundTripIsByteIdenticalAndChecked) {
  test::TempDir dir;
  torch::manual_seed(0);
  GPT m(tiny_model(), 64);
  save_safetensors(dir / "a.safetensors", module_tensors(*m), {{"format", "pt"}});
  torch::manual_seed(0);
  GPT m2(tiny_model(), 64);
  save_safetensors(dir / "b.safetensors", module_tensors(*m2), {{"format", "pt"}});
  EXPECT_EQ(test::read_text(dir / "a.safetensors"), test::read_text(dir / "b.safetensors"));
  std::map<std::string, std::string> meta;
  auto loaded = load_safetensors(dir / "a.safetensors", &meta);
  EXPECT_EQ(meta.at("format"), "pt");
  torch::manual_seed(9);
  GPT m3(tiny_model(), 64);
  load_into_module(*m3, loaded, "a");
  auto x = module_tensors(*m), y = module_tensors(*m3);
  for (size_t i = 0; i < x.size(); ++i) EXPECT_TRUE(torch::equal(x[i].second, y[i].second));
  // Header layout: u64 length, JSON, 8-byte aligned data.
  auto bytes = test::read_text(dir / "a.safetensors");
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  EXPECT_EQ(hlen % 8, 0u);
  EXPECT_EQ(bytes[8], '{');
  // A truncated file or a shape mismatch is a CheckpointError naming the problem.
  test::write_text(dir / "bad.safetensors", bytes.substr(0, bytes.size() - 4));
  EXPECT_THROW(load_safetensors(dir / "bad.safetensors"), CheckpointError);
  GPT other(tiny_model(), 128);
  EXPECT_THROW(load_into_module(*other, loaded, "a"), CheckpointError);
}

TEST(Generate, SeededAndGreedy) {
  torch::manual_seed(0);
  LM m = build_model(tiny_model(), 64);
  SampleOptions o;
  o.max_new_tokens = 20;  // longer than seq_len - prompt: the context is cropped
  o.vocab_limit = 50;
  torch::manual_seed(5);
  auto a = generate(m, {1, 2, 3}, o);
  torch::manual_seed(5);
  auto b = generate(m, {1, 2, 3}, o);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 23u);
  for (size_t i = 3; i < a.size(); ++i) EXPECT_LT(a[i], 50);
  o.top_k = 1;
  o.max_new_tokens = 1;
  auto g = generate(m, {1, 2, 3}, o);
  auto logits = m->forward(torch::tensor(std::vector<int64_t>{1, 2, 3}).view({1, 3}));
  EXPECT_EQ(g.back(), logits[0][2].slice(0, 0, 50).argmax().item<int64_t>());
}

}  // namespace
}  // namespace lm
