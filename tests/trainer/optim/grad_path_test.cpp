// The gradient path's switches (optim.free_grads, optim.clip_in_step; trainer/optim/adamw.h): free
// per-parameter gradients and the fused AdamW over per-parameter lists against the flat path on a
// real model; clipping through _fused_adamw_'s grad_scale against clip-then-step, in ulps; the
// trainer with both switches off byte-identical to its default; the refusals. What needs the fused
// AdamW on a CPU runs against LibTorch >= 2.4 (`bash launch/dev/torch2.sh cpu -R GradPath`) and skips
// on 1.13 saying so.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/errors.h"
#include "common/torch/compat.h"
#include "models/gpt.h"
#include "tests/testutil.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/optim/adamw.h"
#include "run/run_dir.h"

namespace lm {
namespace {

using test::TempDir;

std::string needs_cpu_fused_adamw() {
  if (!compat::kHasCpuFusedAdamW)
    return "LibTorch " + compat::torch_version() + " has no CPU at::_fused_adamw_ (>= 2.4): "
           "bash launch/dev/torch2.sh cpu -R GradPath runs this against LibTorch 2.6";
  return "";
}

OptimConfig optim(const std::string& free_grads, const std::string& clip_in_step, double clip) {
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.fused = "on";
  oc.free_grads = free_grads;
  oc.clip_in_step = clip_in_step;
  oc.grad_clip = clip;
  return oc;
}

// A tiny GPT, its flat parameters on the path `oc` resolves to (world 1, CPU), and AdamW.
struct Trained {
  explicit Trained(const OptimConfig& oc) : cfg(oc), model(nullptr) {
    torch::manual_seed(7);
    model = GPT(test::tiny_model(), 64);
    flat = std::make_unique<FlatParams>(*model, resolve_grad_path(oc, /*cuda=*/false, 1));
    opt = std::make_unique<AdamW>(*flat, oc);
  }
  // One trainer step over `accum` micro-batches (as ForwardBackward::run and StepUpdate do);
  // returns the grad norm before clipping.
  double step(int k, int accum) {
    flat->zero_grad();
    for (int m = 0; m < accum; ++m) {
      torch::manual_seed(1000 + 10 * k + m);
      auto idx = torch::randint(0, 64, {4, 16}, torch::kLong);
      (model->loss_sum(idx, idx.roll(1, 1)) / (4.0 * 16 * accum)).backward();
    }
    const double norm = clip_grad_norm(*flat, cfg.grad_clip).item<double>();
    opt->step(cfg.lr);
    return norm;
  }
  bool grads_undefined() const {
    for (auto& p : model->parameters())
      if (p.grad().defined()) return false;
    return true;
  }
  OptimConfig cfg;
  GPT model;
  std::unique_ptr<FlatParams> flat;
  std::unique_ptr<AdamW> opt;
};

// The largest distance in units in the last place between two float32 tensors of the same shape
// (bit patterns mapped to a monotonic integer line, so +0 and -0 are 0 apart).
int64_t max_ulps(const torch::Tensor& a, const torch::Tensor& b) {
  auto line = [](const torch::Tensor& t) {
    auto i = t.contiguous().view(torch::kInt32).to(torch::kLong);
    return torch::where(i < 0, -(i + int64_t{2147483648}), i);  // sign-magnitude -> two's complement order
  };
  return (line(a) - line(b)).abs().max().item<int64_t>();
}

// The largest |a - b| in ulps of the operands' scale: of max(|a|, |b|, |before|) elementwise, so a
// weight that a step brings near zero (w - lr * u with w close to lr * u: cancellation) is measured
// against what was rounded, not against the tiny result.
double max_scaled_ulps(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& before) {
  const auto mag = torch::max(torch::max(a.abs(), b.abs()), before.abs());
  const auto ulp = torch::nextafter(mag, torch::full_like(mag, INFINITY)) - mag;
  return ((a - b).abs() / ulp).max().item<double>();
}

int64_t max_ulps_all(Trained& x, Trained& y) {
  return std::max({max_ulps(x.flat->params(), y.flat->params()), max_ulps(x.opt->exp_avg(), y.opt->exp_avg()),
                   max_ulps(x.opt->exp_avg_sq(), y.opt->exp_avg_sq())});
}

// The relative difference of two float32 norms of the same gradients summed in different orders.
// Each is a sum of squares of N (~28k) positive terms rounded at every addition; the flat buffer's
// is reduced in the 8 (AVX2) or 16 (AVX-512) lanes of a vector register, each lane adding N/8 or
// N/16 terms one after another; _foreach_norm's per tensor, then their norm. A rounding of a
// partial sum S_i errs by at most u S_i (u = 2^-24), of either sign; summed over a lane that is
// u S sqrt(n/3)/sqrt(3) at one standard deviation (Higham & Mary's probabilistic analysis; the
// worst case, u S n, needs every rounding to go one way), so the flat norm's relative error has a
// standard deviation of u sqrt(N) / (6 L) (the square root halves it): 2.1e-7 for L = 8, and the
// per-tensor sums' are smaller. 2e-6 is about eight of those standard deviations of the difference
// at L = 8: what another CPU's lanes (another order, the same sizes) can give, not what one gave.
constexpr double kNormRel = 2e-6;

// (a) Free gradients (undefined between steps, assigned by the first backward, summed by the second
// with grad_accum 2) through the fused AdamW on one list entry per parameter: bit-equal to the flat
// path without clipping (the same gradients in the same elementwise kernel; the flat buffer's
// zeros add nothing) and with clipping not active. With clipping active the norm is taken another
// way (_foreach_norm's per-tensor norms, then their norm, against one norm over the flat buffer), so
// the coefficient may differ in its last bits (kNormRel), and every clipped gradient with it.
// Weights, per step taken: each path rounds w - lr u once, so two updates whose exact values differ
// by far less than an ulp can still land one ulp of w apart: 2^-23 for |w| in [1, 2) (the LayerNorm
// gains start at 1; no weight reaches 2: checked), which is 1.19e-5 of a step (lr 1e-2) by itself
// (the bound was 1e-5 of a step over all five steps: an AMD EPYC measured 1.19e-5, one such ulp).
// Beside it, lr times the updates' difference: u = m / (sqrt(v) + eps) moves by at most the
// gradients' relative difference (the clip coefficient's, kNormRel, then the ulps that differing
// weights give the next backward), allowed 1e-5 per step. So after step k: k (2^-23 / lr + 1e-5)
// of a step. Measured and printed, with the first step's ulps. AdamW's eps is raised to 1e-3, as in
// models/model_test.cpp, since the key bias's gradients are float noise (~1e-10) that eps 1e-8
// would turn into whole steps of random sign.
// Checked to fail with FlatParams::zero_grad made a no-op on the free path (gradients summed
// across steps: params differ from step 2 on).
TEST(GradPath, FreeGradsMatchTheFlatPathOnARealModel) {
  if (auto why = needs_cpu_fused_adamw(); !why.empty()) GTEST_SKIP() << why;
  for (double max_norm : {0.0, 1e3}) {
    for (int accum : {1, 2}) {
      Trained flat(optim("off", "off", max_norm)), freeg(optim("on", "off", max_norm));
      ASSERT_FALSE(flat.flat->path().free_grads);
      ASSERT_TRUE(freeg.flat->path().free_grads);
      ASSERT_TRUE(freeg.grads_undefined()) << "free gradients start undefined";
      EXPECT_THROW(freeg.flat->grads(), c10::Error) << "no flat gradient buffer on the free path";
      for (int k = 0; k < 5; ++k) {
        SCOPED_TRACE("max_norm " + std::to_string(max_norm) + ", grad_accum " + std::to_string(accum) + ", step " +
                     std::to_string(k + 1));
        const double na = flat.step(k, accum), nb = freeg.step(k, accum);
        EXPECT_NEAR(na, nb, kNormRel * na);
        EXPECT_TRUE(freeg.grads_undefined()) << "the update left gradients behind";
        EXPECT_TRUE(torch::equal(flat.flat->params(), freeg.flat->params())) << max_ulps_all(flat, freeg) << " ulps";
        EXPECT_TRUE(torch::equal(flat.opt->exp_avg(), freeg.opt->exp_avg()));
        EXPECT_TRUE(torch::equal(flat.opt->exp_avg_sq(), freeg.opt->exp_avg_sq()));
      }
      EXPECT_EQ(freeg.opt->steps(), 5);
    }
  }
  // Clipping active every step (max norm 0.05), in a pass of its own and inside the step.
  for (const char* in_step : {"off", "on"}) {
    auto oc = optim("off", "off", 0.05);
    oc.eps = 1e-3;
    auto oc_free = oc;
    oc_free.free_grads = "on", oc_free.clip_in_step = in_step;
    Trained flat(oc), freeg(oc_free);
    const double per_step = std::ldexp(1.0, -23) / oc.lr + 1e-5;  // one ulp of |w| < 2, and the update's part
    double worst_step = 0, worst_norm = 0, worst_rel_bound = 0;
    for (int k = 0; k < 5; ++k) {
      SCOPED_TRACE(std::string("clip_in_step ") + in_step + ", step " + std::to_string(k + 1));
      const auto before = flat.flat->params().clone();
      const double na = flat.step(k, 2), nb = freeg.step(k, 2);
      EXPECT_GT(na, 0.05) << "clipping not active";
      worst_norm = std::max(worst_norm, std::abs(na - nb) / na);
      if (k == 0)
        std::printf("free grads, clip_in_step=%s, clipping active, one step: params within %.2f ulps of their scale, "
                    "moments within %lld ulps\n", in_step,
                    max_scaled_ulps(flat.flat->params(), freeg.flat->params(), before),
                    (long long)std::max(max_ulps(flat.opt->exp_avg(), freeg.opt->exp_avg()),
                                        max_ulps(flat.opt->exp_avg_sq(), freeg.opt->exp_avg_sq())));
      ASSERT_LT(flat.flat->params().abs().max().item<double>(), 2.0) << "the premise of the ulp term: |w| < 2";
      const double d = (flat.flat->params() - freeg.flat->params()).abs().max().item<double>() / oc.lr;
      EXPECT_LE(d, (k + 1) * per_step) << "weights apart, in steps (lr)";
      worst_step = std::max(worst_step, d);
      worst_rel_bound = std::max(worst_rel_bound, d / ((k + 1) * per_step));
    }
    std::printf("free grads, clip_in_step=%s, clipping active, 5 steps: norms within %.2g relative (bound %.0e), "
                "weights within %.2g of a step (lr; at most %.2f of the bound)\n", in_step, worst_norm, kNormRel,
                worst_step, worst_rel_bound);
    EXPECT_LE(worst_norm, kNormRel);
  }
}

// A parameter that backward does not reach keeps an undefined free gradient; the step then uses
// zeros for it, as the flat buffer would hold (weights decay, moments decay): bit-equal.
TEST(GradPath, AnUnreachedParameterStepsAsWithZeroGradients) {
  if (auto why = needs_cpu_fused_adamw(); !why.empty()) GTEST_SKIP() << why;
  Trained flat(optim("off", "off", 1e3)), freeg(optim("on", "on", 1e3));
  for (int k = 0; k < 2; ++k) flat.step(k, 1), freeg.step(k, 1);
  for (auto* t : {&flat, &freeg}) {
    t->flat->zero_grad();  // no backward: every gradient is zero / undefined
    EXPECT_EQ(clip_grad_norm(*t->flat, 1e3).item<double>(), 0.0);
    t->opt->step(1e-2);
  }
  EXPECT_TRUE(torch::equal(flat.flat->params(), freeg.flat->params())) << max_ulps_all(flat, freeg) << " ulps";
  EXPECT_TRUE(torch::equal(flat.opt->exp_avg(), freeg.opt->exp_avg()));
}

// (b) Clipping through grad_scale (the kernel divides by max(1, (norm + 1e-6) / max_norm)) against
// multiplying by min(1, max_norm / (norm + 1e-6)) first, one step from the same weights and
// gradients: the clipped gradient within one ulp (a product with a rounded coefficient against one
// correctly rounded quotient), which the update passes on to the moments (a few ulps: exp_avg_sq
// squares it) and the weights (a few ulps of their scale: the step is m / (sqrt(v) + eps); measured,
// printed). Where clipping is
// not active the divisor is exactly 1: bit-equal, for three steps. Checked to fail with the divisor
// inverted (max_norm / (norm + 1e-6)).
TEST(GradPath, ClipInStepMatchesClipThenStepWithinAnUlp) {
  if (auto why = needs_cpu_fused_adamw(); !why.empty()) GTEST_SKIP() << why;
  for (double max_norm : {0.05, 1e3}) {
    Trained a(optim("off", "off", max_norm)), b(optim("off", "on", max_norm));
    ASSERT_TRUE(b.flat->path().clip_in_step);
    const auto before = a.flat->params().clone();
    const double norm = a.step(0, 1);
    EXPECT_EQ(b.step(0, 1), norm) << "the reported norm is the one before clipping";
    EXPECT_EQ(norm > max_norm, max_norm < 1) << "norm " << norm;
    const double p = max_scaled_ulps(a.flat->params(), b.flat->params(), before);
    const int64_t m = max_ulps(a.opt->exp_avg(), b.opt->exp_avg()), v = max_ulps(a.opt->exp_avg_sq(), b.opt->exp_avg_sq()),
                  g = max_ulps(a.flat->grads(), b.flat->grads());  // the kernel stores the quotient back
    std::printf("clip_in_step, max_norm %g (clipping %s), one step: max ulps: clipped gradients %lld, exp_avg %lld, "
                "exp_avg_sq %lld, params %.2f (of their scale; %lld raw)\n", max_norm, max_norm < 1 ? "active" : "inactive",
                (long long)g, (long long)m, (long long)v, p, (long long)max_ulps(a.flat->params(), b.flat->params()));
    if (max_norm < 1) {
      EXPECT_LE(g, 1);  // a product with a rounded coefficient against one correctly rounded quotient
      EXPECT_LE(m, 2);  // 0.1 g, rounded
      EXPECT_LE(v, 8);  // 0.05 g^2, the gradient's relative difference doubled, three roundings
      EXPECT_LE(p, 8.0);  // measured 6: m / (sqrt(v) + eps) carries both moments' ulps into the step
    } else {
      for (int k = 1; k < 3; ++k) a.step(k, 1), b.step(k, 1);
      EXPECT_EQ(max_ulps_all(a, b), 0);
    }
  }
}

// ---- the trainer ----------------------------------------------------------------------------

test::RunResult gp_run_trainer(const std::string& run, std::vector<std::string> extra, std::vector<std::string> env = {}) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(),
                                "run.dir=" + run, "eval.batches=0", "train.threads=1", "log.every_steps=1"};
  a.insert(a.end(), extra.begin(), extra.end());
  env.push_back("OMP_NUM_THREADS=1");
  auto p = test::spawn_bin("trainer", a, run + ".out", env);
  test::RunResult r;
  r.exit_code = test::wait_proc(p, 300);
  r.out = test::read_text(run + ".out");
  return r;
}

std::vector<double> gp_losses(const std::string& run) {
  std::vector<double> out;
  for (auto& l : test::metrics_of_kind(run + "/metrics.jsonl", "train")) {
    const auto j = nlohmann::json::parse(l)["loss"];
    out.push_back(j.is_number() ? j.get<double>() : NAN);  // a non-finite loss is written as null
  }
  return out;
}

// (c) `off` is the code before the switches (the flat gradient buffer, clipped by a pass of its
// own: GradPath{}, what FlatParams is made with when given no path) on every device, world and
// optim.fused; `auto` is `off` on a CPU, and turns the switches on only on CUDA where the fused
// AdamW runs (free gradients only without a process group). This replaces a trainer run with the
// defaults against one with both switches off on a CPU, where both resolve to this one path: it
// compared that path with itself. What the flat path computes is checked against the free path
// (a) and against clip-then-step (b) above. Checked to fail with `cuda &&` dropped from either
// auto (auto on a CPU turns a switch on).
TEST(GradPath, OffIsTheFlatPathEverywhereAndAutoIsOffOnACpu) {
  auto cfg = [](const char* fused, const char* sw) {
    OptimConfig oc;
    oc.fused = fused;
    oc.free_grads = sw;
    oc.clip_in_step = sw;
    return oc;
  };
  auto is_flat = [](const GradPath& p) { return !p.free_grads && !p.clip_in_step; };
  EXPECT_TRUE(is_flat(GradPath{}));
  for (const char* fused : {"auto", "off"}) {
    for (bool cuda : {false, true}) {
      for (int world : {1, 2}) {
        for (bool pg : {false, true}) {
          SCOPED_TRACE(std::string("optim.fused=") + fused + (cuda ? ", CUDA" : ", CPU") + ", world " +
                       std::to_string(world) + (pg ? ", process group" : ""));
          EXPECT_TRUE(is_flat(resolve_grad_path(cfg(fused, "off"), cuda, world, pg)));
          const GradPath a = resolve_grad_path(cfg(fused, "auto"), cuda, world, pg);
          if (!cuda || std::string(fused) == "off") {
            EXPECT_TRUE(is_flat(a)) << "auto without the fused AdamW is off";
          }
        }
      }
    }
  }
  if (compat::kHasFusedAdamW) {  // CUDA, fused auto (the kernel there): both on for one rank alone
    const GradPath a = resolve_grad_path(cfg("auto", "auto"), /*cuda=*/true, 1, false);
    EXPECT_TRUE(a.free_grads && a.clip_in_step);
    const GradPath b = resolve_grad_path(cfg("auto", "auto"), /*cuda=*/true, 2, false);
    EXPECT_TRUE(!b.free_grads && b.clip_in_step) << "free gradients need one rank";
  }
  if (compat::kHasCpuFusedAdamW) {  // the fused AdamW on a CPU: auto still off there
    EXPECT_TRUE(is_flat(resolve_grad_path(cfg("on", "auto"), /*cuda=*/false, 1, false)));
  }
}

// Both switches on (and the fused AdamW) against the fused AdamW alone, with step 6 made non-finite
// (gated on the device: found_inf skips the update, the EMA and the counter; the NaN norm's
// grad_scale is never applied): the same training within float rounding (the norm's reduction and
// the clip's division differ), and the path was taken.
TEST(GradPath, SwitchesOnTrainLikeTheFusedPathAcrossANonFiniteStep) {
  if (auto why = needs_cpu_fused_adamw(); !why.empty()) GTEST_SKIP() << why;
  TempDir a, b;
  const std::vector<std::string> common = {"train.max_steps=12", "train.grad_accum=2", "optim.grad_clip=0.5",
                                           "optim.fused=on", "train.ema_decay=0.9", "anomaly.action=continue",
                                           "anomaly.max_dumps=0"};
  const std::vector<std::string> nan6 = {"LM_FAULT_NAN_STEP=6"};
  auto ra = gp_run_trainer(a.path(), common, nan6);
  ASSERT_EQ(ra.exit_code, 0) << ra.out;
  auto v = common;
  v.insert(v.end(), {"optim.free_grads=on", "optim.clip_in_step=on"});
  auto rb = gp_run_trainer(b.path(), v, nan6);
  ASSERT_EQ(rb.exit_code, 0) << rb.out;
  EXPECT_NE(rb.out.find("gradients: per parameter, freed after each update (optim.free_grads), clipped inside the "
                        "fused AdamW (optim.clip_in_step)"), std::string::npos) << rb.out;
  EXPECT_NE(rb.out.find("read one step late"), std::string::npos) << "not deferred: " << rb.out;
  const auto la = gp_losses(a.path()), lb = gp_losses(b.path());
  ASSERT_EQ(la.size(), 12u);
  ASSERT_EQ(lb.size(), 12u);
  for (size_t i = 0; i < la.size(); ++i) {
    if (i == 5) {
      EXPECT_TRUE(std::isnan(la[i]) && std::isnan(lb[i])) << la[i] << " " << lb[i];
    } else {
      EXPECT_NEAR(la[i], lb[i], 1e-5 * la[i]) << "step " << i + 1;
    }
  }
  const std::string last = "/checkpoints/" + run_dir::step_name(12) + "/";
  auto steps = [&](const std::string& run) {
    return nlohmann::json::parse(test::read_text(run + last + "state.json"))["components"]["optimizer"]["step"].get<int64_t>();
  };
  EXPECT_EQ(steps(a.path()), 11);
  EXPECT_EQ(steps(b.path()), 11);
  auto wa = load_safetensors(a.path() + last + "ema.safetensors"), wb = load_safetensors(b.path() + last + "ema.safetensors");
  ASSERT_EQ(wa.size(), wb.size());
  for (size_t i = 0; i < wa.size(); ++i) {
    EXPECT_TRUE(torch::isfinite(wb[i].second).all().item<bool>()) << wb[i].first;
    EXPECT_TRUE(torch::allclose(wa[i].second, wb[i].second, 1e-4, 1e-5)) << wa[i].first;
  }
}

// (d) Refusals: one line, exit 2, before the run writes anything. On a CPU optim.fused=auto gives
// the flat update, so "on" is refused on every LibTorch; with two ranks free gradients are refused
// whatever optim.fused gives (the world is checked first).
// The files under a run directory but the log and the lock, which a refused start may open.
std::string files_written(const std::string& dir) {
  std::string out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    const std::string rel = std::filesystem::relative(e.path(), dir).string();
    if (e.is_regular_file() && rel.rfind("logs", 0) != 0 && rel != "run.lock") out += " " + rel;
  }
  return out;
}

void expect_one_line_refusal(const test::RunResult& r, const std::string& key, const std::string& run) {
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("key '" + key + "': on needs"), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
  EXPECT_EQ(files_written(run), "");
}

TEST(GradPath, OnWithoutTheFusedAdamWIsRefusedInOneLine) {
  for (const char* key : {"optim.free_grads", "optim.clip_in_step"}) {
    TempDir run;
    auto r = gp_run_trainer(run.path(), {"train.max_steps=2", std::string(key) + "=on"});
    SCOPED_TRACE(key);
    expect_one_line_refusal(r, key, run.path());
    EXPECT_NE(r.out.find("on needs the fused AdamW"), std::string::npos) << r.out;
  }
}

// One rank in a process group (dist.backend named) all-reduces the flat buffer as two would.
TEST(GradPath, FreeGradsWithAProcessGroupAtWorldSizeOneIsRefused) {
  TempDir run;
  auto r = gp_run_trainer(run.path(), {"train.max_steps=2", "optim.free_grads=on", "dist.backend=gloo"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("key 'optim.free_grads': on needs one rank without a process group (this run has 1, and "
                       "dist.backend names one)"), std::string::npos) << r.out;
  EXPECT_EQ(files_written(run.path()), "");
}

TEST(GradPath, FreeGradsOnTwoRanksIsRefused) {
  TempDir run;
  const int port = test::free_port();
  std::vector<test::Proc> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.push_back(test::spawn_bin(
        "trainer",
        {test::source_path("configs/tiny.yaml"), "data.train=" + test::shared_bytes_dataset(), "run.dir=" + run.path() + "/run",
         "eval.batches=0", "train.threads=1", "train.max_steps=2", "optim.free_grads=on", "dist.timeout_s=30"},
        run / ("out" + std::to_string(r)),
        test::rank_env(r, 2, port)));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(test::wait_proc(ranks[r], 120), 2) << test::read_text(run / ("out" + std::to_string(r)));
    const std::string out = test::read_text(run / ("out" + std::to_string(r)));
    const std::string line = "key 'optim.free_grads': on needs one rank without a process group (this run has 2)";
    EXPECT_NE(out.find(line), std::string::npos) << out;
    EXPECT_EQ(out.find(line), out.rfind(line)) << "said more than once: " << out;
  }
  EXPECT_EQ(files_written(run.path() + "/run"), "");
}

}  // namespace
}  // namespace lm
