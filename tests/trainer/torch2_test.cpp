// What the GPU path runs, run on a CPU where LibTorch can (>= 2.4; `bash launch/dev/torch2.sh` runs
// this suite against Debian 13's LibTorch 2.6): at::_fused_adamw_ gated on the device (one shared
// step counter, the found_inf skip and its undo, the one-step-late reads, EMA gated the same way)
// against the flat AdamW step for step; bf16 autocast and its cast cache; at::scaled_dot_product_attention against
// the fused 1.13 attention kernel. On LibTorch 1.13 each test skips saying what it needs.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <map>

#include "common/torch/compat.h"
#include "models/attention.h"
#include "models/cpu_kernels.h"
#include "models/gpt.h"
#include "tests/testutil.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/ema.h"
#include "run/run_dir.h"

namespace lm {
namespace {

using test::TempDir;

std::string needs_torch_2_4() {
  if (!compat::kHasCpuFusedAdamW || !compat::kHasCpuAutocast)
    return "LibTorch " + compat::torch_version() + " has no CPU at::_fused_adamw_ / per-device autocast (>= 2.4): " +
           "bash launch/dev/torch2.sh runs this against LibTorch 2.6";
  return "";
}

OptimConfig optim_config_fused(const std::string& fused) {
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  oc.fused = fused;
  return oc;
}

struct OptimPair {
  explicit OptimPair(const std::string& fused) : model(nullptr) {
    torch::manual_seed(7);
    model = GPT(test::tiny_model(), 64);
    flat = std::make_unique<FlatParams>(*model);
    opt = std::make_unique<AdamW>(*flat, optim_config_fused(fused));
    ema = std::make_unique<Ema>(*flat, 0.9);
  }
  GPT model;
  std::unique_ptr<FlatParams> flat;
  std::unique_ptr<AdamW> opt;
  std::unique_ptr<Ema> ema;
};

void expect_near_t2(const torch::Tensor& a, const torch::Tensor& b, const std::string& what, double rtol = 1e-5,
                  double atol = 1e-6) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  EXPECT_TRUE(torch::allclose(a, b, rtol, atol)) << what << ": max abs diff " << (a - b).abs().max().item<double>();
}

// Step for step, with a non-finite step in the middle: the fused kernel, gated on the device by
// found_inf, leaves weights, moments, EMA and the step count as the flat update (gated on the host)
// does. Checked to fail with the undo of the counter removed (steps 5 vs 4, params differ) and
// with the EMA's gate removed (EMA differs).
TEST(Torch2Cpu, FusedAdamWGatedOnTheDeviceMatchesTheFlatStep) {
  if (auto why = needs_torch_2_4(); !why.empty()) GTEST_SKIP() << why;
  OptimPair flat("off"), fused("on");
  ASSERT_FALSE(flat.opt->fused());
  ASSERT_TRUE(fused.opt->fused());
  for (int k = 0; k < 5; ++k) {
    torch::manual_seed(100 + k);
    const auto g = torch::randn({flat.flat->numel()}) * (k + 1);
    flat.flat->grads().copy_(g);
    fused.flat->grads().copy_(g);
    const bool nonfinite = k == 2;
    const double lr = 1e-2 * (k + 1);
    const auto found_inf = torch::full({}, nonfinite ? 1.0f : 0.0f);
    if (!nonfinite) {  // the host path: a non-finite step is not taken at all
      flat.opt->step(lr);
      flat.ema->update();
    }
    fused.opt->step(lr, found_inf);
    fused.ema->update(found_inf);
    SCOPED_TRACE("step " + std::to_string(k + 1));
    expect_near_t2(fused.flat->params(), flat.flat->params(), "params");
    expect_near_t2(fused.opt->exp_avg(), flat.opt->exp_avg(), "exp_avg");
    expect_near_t2(fused.opt->exp_avg_sq(), flat.opt->exp_avg_sq(), "exp_avg_sq");
    expect_near_t2(fused.ema->state().tensors[0].second, flat.ema->state().tensors[0].second, "ema");
    EXPECT_EQ(fused.opt->steps(), flat.opt->steps());
  }
  EXPECT_EQ(fused.opt->steps(), 4);
  // The counter survives a checkpoint: state out, into a fresh optimizer, one more step each.
  OptimPair resumed("on");
  resumed.flat->params().copy_(fused.flat->params());
  const ComponentState saved = fused.opt->state();
  resumed.opt->load_state(&saved);
  EXPECT_EQ(resumed.opt->steps(), 4);
  for (auto* t : {&fused, &resumed}) t->flat->grads().fill_(0.5), t->opt->step(1e-2);
  expect_near_t2(resumed.flat->params(), fused.flat->params(), "after resume");
}

TEST(Torch2Cpu, FusedOnIsRefusedWhereLibTorchHasNoCpuKernel) {
  if (compat::kHasCpuFusedAdamW) GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has the CPU kernel";
  torch::manual_seed(7);
  GPT model(test::tiny_model(), 64);
  FlatParams flat(*model);
  try {
    AdamW opt(flat, optim_config_fused("on"));
    FAIL() << "optim.fused=on accepted without a CPU kernel";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optim.fused"), std::string::npos) << e.what();
  }
}

std::map<std::string, torch::Tensor> tensors_by_name(const std::string& path) {
  std::map<std::string, torch::Tensor> out;
  for (auto& [name, t] : load_safetensors(path)) out[name] = t;
  return out;
}

std::vector<nlohmann::json> t2_train_records(const std::string& run) {
  std::vector<nlohmann::json> out;
  for (auto& line : test::metrics_of_kind(run + "/metrics.jsonl", "train")) out.push_back(nlohmann::json::parse(line));
  return out;
}

test::RunResult run_trainer(const std::string& run, std::vector<std::string> extra, std::vector<std::string> env = {}) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                                "run.dir=" + run, "eval.batches=0", "train.threads=1", "checkpoint.every_steps=0"};
  a.insert(a.end(), extra.begin(), extra.end());
  auto p = test::spawn_bin("trainer", a, run + ".out", env);
  test::RunResult r;
  r.exit_code = test::wait_proc(p, 300);
  r.out = test::read_text(run + ".out");
  return r;
}

// The whole trainer on the fused path (results read one step late between logged steps, the
// update and the EMA gated on the device) against the flat path, with step 6 made non-finite.
TEST(Torch2Cpu, TrainerOnTheFusedPathMatchesTheFlatPathAcrossANonFiniteStep) {
  if (auto why = needs_torch_2_4(); !why.empty()) GTEST_SKIP() << why;
  TempDir a, b;
  const std::vector<std::string> common = {"train.max_steps=12", "log.every_steps=4", "train.ema_decay=0.9",
                                           "anomaly.action=continue", "anomaly.max_dumps=0"};
  auto with = [&](const char* fused) { auto v = common; v.push_back(std::string("optim.fused=") + fused); return v; };
  const std::vector<std::string> nan6 = {"LM_FAULT_NAN_STEP=6"};
  auto ra = run_trainer(a.path(), with("off"), nan6);
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  auto rb = run_trainer(b.path(), with("on"), nan6);
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  EXPECT_NE(rb.out.find("read one step late"), std::string::npos) << "the fused run did not defer: " << rb.out;
  EXPECT_EQ(ra.out.find("read one step late"), std::string::npos);
  const auto la = t2_train_records(a.path()), lb = t2_train_records(b.path());
  ASSERT_EQ(la.size(), 3u);
  ASSERT_EQ(lb.size(), 3u);
  for (size_t i = 0; i < la.size(); ++i) {
    SCOPED_TRACE("record " + std::to_string(i));
    const double x = la[i]["loss"].is_number() ? la[i]["loss"].get<double>() : NAN;
    const double y = lb[i]["loss"].is_number() ? lb[i]["loss"].get<double>() : NAN;
    if (i == 1) {  // steps 5-8 hold the non-finite step 6
      EXPECT_TRUE(std::isnan(x) && std::isnan(y)) << x << " " << y;
    } else {
      EXPECT_NEAR(x, y, 1e-4 * std::abs(x));
    }
  }
  const std::string last = "/checkpoints/" + run_dir::step_name(12) + "/";
  for (const char* f : {"model.safetensors", "optimizer.safetensors", "ema.safetensors"}) {
    auto ta = tensors_by_name(a.path() + last + f), tb = tensors_by_name(b.path() + last + f);
    ASSERT_EQ(ta.size(), tb.size()) << f;
    ASSERT_FALSE(ta.empty()) << f;
    for (auto& [name, t] : ta) {
      EXPECT_TRUE(torch::isfinite(tb.at(name)).all().item<bool>()) << f << " " << name;
      expect_near_t2(tb.at(name), t, std::string(f) + " " + name, 1e-4, 1e-5);  // 11 steps of fp32 rounding
    }
  }
  auto steps = [&](const std::string& run) {
    return nlohmann::json::parse(test::read_text(run + last + "state.json"))["components"]["optimizer"]["step"].get<int64_t>();
  };
  EXPECT_EQ(steps(a.path()), 11) << "step 6 was skipped";
  EXPECT_EQ(steps(b.path()), 11) << "the fused path's counter was undone at step 6";
}

// bf16 autocast on the CPU (the cast cache cleared after each forward/backward): a finite loss that
// falls, and stays close to fp32's.
TEST(Torch2Cpu, Bf16AutocastTrainsCloseToFp32) {
  if (auto why = needs_torch_2_4(); !why.empty()) GTEST_SKIP() << why;
  TempDir a, b;
  const std::vector<std::string> common = {"train.max_steps=40", "log.every_steps=10"};
  auto ra = run_trainer(a.path(), common);
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  auto v = common;
  v.push_back("train.dtype=bf16");
  auto rb = run_trainer(b.path(), v);
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  const auto la = t2_train_records(a.path()), lb = t2_train_records(b.path());
  ASSERT_EQ(la.size(), 4u);
  ASSERT_EQ(lb.size(), 4u);
  for (size_t i = 0; i < lb.size(); ++i) {
    const double x = la[i]["loss"].get<double>(), y = lb[i]["loss"].get<double>();
    EXPECT_TRUE(std::isfinite(y));
    EXPECT_NEAR(y, x, 0.03 * x) << "window " << i;
  }
  EXPECT_LT(lb.back()["loss"].get<double>(), lb.front()["loss"].get<double>() - 0.3) << "bf16 loss did not fall";
  // The bf16 run really ran in bf16: its loss differs from fp32's somewhere.
  bool differs = false;
  for (size_t i = 0; i < la.size(); ++i) differs |= la[i]["loss"].get<double>() != lb[i]["loss"].get<double>();
  EXPECT_TRUE(differs) << "bf16 gave fp32's losses bit for bit: autocast was not on";
}

// The autocast cast cache keeps the bf16 copy of an fp32 leaf weight until it is cleared, so a
// later forward would use a weight the optimizer has since changed; the trainer clears it after
// every forward/backward (compat::clear_autocast_cache). FlatParams' weights are such leaves (their
// own tensors over the flat storage, set_data, not autograd views), so they are cached like any.
// Fails with the clear made a no-op.
TEST(Torch2Cpu, AutocastCacheHoldsFlatWeightsUntilCleared) {
  if (auto why = needs_torch_2_4(); !why.empty()) GTEST_SKIP() << why;
  torch::manual_seed(5);
  const torch::Device cpu(torch::kCPU);
  // The weight itself goes to the op (a transposed view would never be cached).
  auto cast_mm = [](const torch::Tensor& x, const torch::Tensor& w) { return torch::mm(x, w).to(torch::kFloat); };
  OptimPair pair("off");
  torch::Tensor w;
  for (auto& p : pair.model->parameters())
    if (p.dim() == 2) { w = p; break; }
  ASSERT_TRUE(w.defined());
  ASSERT_TRUE(w.is_leaf() && w.requires_grad());
  const auto x = torch::randn({4, w.size(0)});
  compat::set_autocast(cpu, true);
  const auto before = cast_mm(x, w);
  {
    torch::NoGradGuard ng;
    w.add_(1.0);  // what the optimizer does between two steps
  }
  const auto stale = cast_mm(x, w);
  compat::clear_autocast_cache();
  const auto fresh = cast_mm(x, w);
  compat::set_autocast(cpu, false);
  compat::clear_autocast_cache();
  EXPECT_TRUE(torch::equal(stale, before)) << "autocast no longer caches a flat weight's cast: the premise changed";
  EXPECT_FALSE(torch::allclose(fresh, before)) << "compat::clear_autocast_cache() left the stale cast in the cache";
}

// at::scaled_dot_product_attention (what 2.x runs) against the fused CPU kernel that 1.13 runs,
// forward and backward, on the packed qkv layout GPT uses.
TEST(Torch2Cpu, SdpaMatchesTheFused113AttentionKernel) {
  if (!compat::kHasSdpa) GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no SDPA (>= 2.0)";
  torch::manual_seed(3);
  const int64_t B = 2, T = 24, H = 4, C = 64;
  auto qkv = torch::randn({B, T, 3 * C}).requires_grad_(true);
  auto qkv2 = qkv.detach().clone().requires_grad_(true);
  ASSERT_TRUE(causal_attention_qkv_applies(qkv2));
  auto y = causal_self_attention(qkv, H, 0.0, /*train=*/true, nullptr, 0);  // SDPA on >= 2.0
  auto y2 = causal_attention_qkv(qkv2, H);
  expect_near_t2(y, y2, "forward", 1e-5, 1e-5);
  const auto g = torch::randn_like(y);
  y.backward(g);
  y2.backward(g);
  expect_near_t2(qkv.grad(), qkv2.grad(), "backward", 1e-4, 1e-5);
}

}  // namespace
}  // namespace lm
