// AdamW's device paths: the fused CUDA kernel (at::_fused_adamw_) against the CPU flat update, the
// found_inf gate on both, and HostScalars (device values read back late). The CUDA cases compile
// only where LibTorch has CUDA (LM_CUDA) and skip without a GPU: bench/gpu.sh runs them there.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <torch/torch.h>

#include "common/test_hooks.h"
#include "common/torch/compat.h"
#include "tests/testutil.h"
#include "models/build.h"
#include "models/gpt.h"
#include "trainer/parallel/memory_check.h"
#include "trainer/optim/adamw.h"
#include "trainer/runtime/device.h"
#include "trainer/telemetry/mfu.h"
#include "trainer/runtime/host_allocator.h"

namespace lm {
namespace {

using test::tiny_model;

OptimConfig optim_config() {
  OptimConfig oc;
  oc.lr = 1e-2;
  oc.weight_decay = 0.1;
  return oc;
}

// The same model, flat parameters and optimizer on one device.
struct Twin {
  explicit Twin(const torch::Device& device) : model(nullptr) {
    torch::manual_seed(7);
    model = GPT(tiny_model(), 64);
    model->to(device);
    flat = std::make_unique<FlatParams>(*model);
    opt = std::make_unique<AdamW>(*flat, optim_config());
  }
  GPT model;
  std::unique_ptr<FlatParams> flat;
  std::unique_ptr<AdamW> opt;
};

// Gradients for step k: the same values on every device, a few large, none zero.
torch::Tensor grads_for(int k, int64_t n) {
  torch::manual_seed(100 + k);
  return torch::randn({n}) * (k + 1);
}

#if LM_CUDA
void expect_close(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  EXPECT_TRUE(torch::allclose(a.cpu(), b.cpu(), 1e-5, 1e-6))
      << what << ": max abs diff " << (a.cpu() - b.cpu()).abs().max().item<double>();
}
#endif

TEST(Optim, FoundInfSkipsTheStepOnTheHost) {
  Twin a(torch::kCPU), b(torch::kCPU);
  const auto p0 = a.flat->params().clone();
  a.flat->grads().copy_(grads_for(0, a.flat->numel()));
  b.flat->grads().copy_(a.flat->grads());
  a.opt->step(1e-2, torch::ones({}));  // skipped: nothing moves, nothing is counted
  EXPECT_TRUE(torch::equal(a.flat->params(), p0));
  EXPECT_EQ(a.opt->exp_avg().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(a.opt->steps(), 0);
  a.opt->step(1e-2, torch::zeros({}));
  b.opt->step(1e-2);
  EXPECT_TRUE(torch::equal(a.flat->params(), b.flat->params()));
  EXPECT_EQ(a.opt->steps(), 1);
}

// A measured CPU peak that a training window beats was measured on a busy host: it is measured
// again once and the higher kept, so MFU stays under 100%; a given peak is never replaced.
TEST(Device, MeasuredPeakBeatenByTrainingIsMeasuredAgainOnce) {
  MfuPeak given{1e9, "log.peak_tflops"};
  EXPECT_DOUBLE_EQ(given.pct(2e9), 200.0);
  EXPECT_DOUBLE_EQ(given.flops, 1e9);
  EXPECT_FALSE(given.refresh(0)) << "a given peak is never measured";
  MfuPeak slow{1e6, "measured while busy", true};  // below any real SGEMM rate
  const double pct = slow.pct(std::max(1e7, 2 * best_sgemm_flops()));
  EXPECT_GT(slow.flops, 1e8) << "measured again: LibTorch's 1024^3 SGEMM runs far above 1e6 FLOP/s";
  EXPECT_TRUE(slow.beaten) << "only once: a run still beating it says MFU over 100% in its records";
  EXPECT_GT(pct, 0.0);
  const double again = slow.flops;
  EXPECT_DOUBLE_EQ(slow.pct(2 * again), 200.0);
  EXPECT_TRUE(std::isnan(MfuPeak{}.pct(1e9))) << "unknown peak: null in the records";
}

// The CPU peak is never below an SGEMM this process measured: a peak measured low at start (seen:
// 38.8 GFLOP/s against a roof of 69.7, MFU logged 85% for 68%) is replaced by any better
// measurement, whether or not a window beats it; refresh() measures again at the run's idle
// points and keeps the best; the start's peak is the best measured so far.
TEST(Device, MeasuredPeakIsNeverBelowAnSgemmOfTheProcess) {
  const double measured = measure_sgemm_flops(256, 3, 0.01);
  EXPECT_GT(measured, 1e8);
  EXPECT_GE(best_sgemm_flops(), measured);
  MfuPeak low{1e6, "measured at start while busy", true};
  const double half = best_sgemm_flops() / 2;  // a window well under the real roof
  // ~50 (%), two or three double roundings apart (2^-53 relative each, ~1e-14 here): 1e-12.
  EXPECT_NEAR(low.pct(half), 100.0 * half / best_sgemm_flops(), 1e-12) << "MFU against the best, not the low start";
  EXPECT_FALSE(low.beaten) << "not beaten: the best known SGEMM was already the peak";
  EXPECT_DOUBLE_EQ(low.flops, best_sgemm_flops());
  MfuPeak stale{1e6, "measured at start while busy", true};
  stale.measured_at = std::chrono::steady_clock::now();
  EXPECT_FALSE(stale.refresh(3600)) << "not due: nothing measured";
  EXPECT_DOUBLE_EQ(stale.flops, 1e6);
  EXPECT_TRUE(stale.refresh(0)) << "due: measured, and the best is far above 1e6";
  EXPECT_GE(stale.flops, best_sgemm_flops());
  set_test_hook("LM_TEST_PEAK_TFLOPS", "");  // the measured start, not the suite's fixed peak (tests/CMakeLists.txt)
  const MfuPeak start = mfu_peak(0, "", "fp32", torch::Device(torch::kCPU));
  EXPECT_TRUE(start.measured);
  EXPECT_GE(start.flops, best_sgemm_flops()) << "the start's peak is the best measured in the process";
  EXPECT_DOUBLE_EQ(mfu_peak(2.5, "", "fp32", torch::Device(torch::kCPU)).flops, 2.5e12) << "log.peak_tflops wins";
}

// The datasheet peaks by device name (as CUDA names the boards): NVL and PCIe boards are not
// reported against the SXM peak; an H100 name without its board is unknown.
TEST(Device, PeakTableTellsTheBoardsApartByName) {
  const std::vector<std::tuple<std::string, double, double>> cases = {
      {"NVIDIA H200", 989, 494},           {"NVIDIA H200 NVL", 835, 418},        {"NVIDIA H200 SXM 141GB", 989, 494},
      {"NVIDIA GH200 480GB", 989, 494},    {"NVIDIA H100 80GB HBM3", 989, 494},  {"NVIDIA H100 SXM5 80GB", 989, 494},
      {"NVIDIA H100 PCIe", 756, 378},      {"NVIDIA H100 NVL", 835, 418},        {"NVIDIA A100-SXM4-80GB", 312, 156},
      {"NVIDIA A100-PCIE-40GB", 312, 156}, {"NVIDIA A100 80GB PCIe", 312, 156},  {"NVIDIA H100", 0, 0},
      {"NVIDIA GeForce RTX 4090", 0, 0},   {"", 0, 0}};
  for (const auto& [name, bf16, fp32] : cases) {
    EXPECT_DOUBLE_EQ(builtin_peak_tflops(name, "bf16"), bf16) << name;
    EXPECT_DOUBLE_EQ(builtin_peak_tflops(name, "fp32"), fp32) << name;
  }
  const MfuPeak nvl = mfu_peak(0, "NVIDIA H200 NVL", "bf16", torch::Device(torch::kCUDA, 0));
  EXPECT_DOUBLE_EQ(nvl.flops, 835e12);
  EXPECT_NE(nvl.source.find("H200 NVL"), std::string::npos) << nvl.source;
}

// The memory estimate's parameters are what model.arch builds: the built module's count for gpt
// and llama of several shapes (GQA, untied and tied heads, the SwiGLU width), and Llama 3 8B's
// 8,030,261,248 computed without allocating it (a GPT formula gave 7.0B for that shape).
TEST(MemoryEstimate, ParametersAreWhatTheArchitectureBuilds) {
  std::vector<ModelConfig> shapes;
  auto gpt = tiny_model();
  shapes.push_back(gpt);
  gpt.seq_len = 48, gpt.d_model = 48, gpt.n_head = 3, gpt.n_layer = 3;
  shapes.push_back(gpt);
  auto llama = tiny_model();
  llama.arch = "llama", llama.n_head = 4, llama.ffn_multiple_of = 16;
  shapes.push_back(llama);  // MHA, untied
  llama.n_kv_head = 2;
  shapes.push_back(llama);  // GQA, untied
  llama.n_kv_head = 1, llama.tie_embeddings = true, llama.ffn_dim_multiplier = 1.3;
  shapes.push_back(llama);  // MQA, tied, a width multiplier
  for (const auto& m : shapes) {
    ExperimentConfig cfg;
    cfg.model = m;
    for (int64_t V : {64, 320}) {
      const double built = static_cast<double>(build_model(m, V)->num_params());
      const auto e = estimate_memory(cfg, V);
      EXPECT_DOUBLE_EQ(e.params, 4 * built) << m.arch << " d " << m.d_model << " kv " << m.n_kv_head << " V " << V;
      EXPECT_DOUBLE_EQ(e.optimizer, 12 * built);
      // ZeRO-1: a rank keeps 1/world_size of the moments (8N); gradients and EMA stay whole.
      ExperimentConfig z = cfg;
      z.dist.zero = 1;
      EXPECT_DOUBLE_EQ(estimate_memory(z, V, false, 1).optimizer, 12 * built);  // one rank: nothing to shard
      EXPECT_DOUBLE_EQ(estimate_memory(z, V, false, 4).optimizer, 4 * built + 2 * built);
      EXPECT_DOUBLE_EQ(estimate_memory(cfg, V, false, 4).optimizer, 12 * built);  // dist.zero: 0
      z.train.ema_decay = 0.999, z.checkpoint.async = true;
      const auto ze = estimate_memory(z, V, false, 2);
      EXPECT_DOUBLE_EQ(ze.optimizer, 8 * built + 4 * built);
      EXPECT_DOUBLE_EQ(ze.staging, 4 * built + 4 * built + 4 * built);  // weights, EMA, this rank's moments
    }
  }
  ExperimentConfig l3;  // Llama 3 8B
  l3.model.arch = "llama", l3.model.n_layer = 32, l3.model.n_head = 32, l3.model.n_kv_head = 8, l3.model.d_model = 4096;
  l3.model.seq_len = 8192, l3.model.ffn_dim_multiplier = 1.3, l3.model.ffn_multiple_of = 1024, l3.model.rope_theta = 500000;
  EXPECT_DOUBLE_EQ(estimate_memory(l3, 128256).params, 4.0 * 8030261248.0);
  // The logits' share: 3 fp32 B*T*V tensors, 2 in the compute dtype with the fused head + loss (auto: CUDA).
  ExperimentConfig g;
  g.train.dtype = "bf16";
  const double BTV = 8.0 * g.model.seq_len * 50304;
  const double plain = estimate_memory(g, 50304, /*cuda=*/false).activations;
  EXPECT_DOUBLE_EQ(plain - estimate_memory(g, 50304, /*cuda=*/true).activations, 3 * BTV * 4 - 2 * BTV * 2);
  g.train.fused_loss = "off";
  EXPECT_DOUBLE_EQ(estimate_memory(g, 50304, /*cuda=*/true).activations, plain);
}

// LibTorch 2.x's CPU kernels (bf16 matmuls) take scratch space through the allocator's raw API,
// which needs the context to be the data pointer and a raw deleter: both sizes (cached and the
// default allocator's small blocks) round-trip, and a freed cached block is handed out again.
TEST(Device, CachingHostAllocatorServesTheRawApi) {
  install_caching_host_allocator();
  c10::Allocator* a = c10::GetCPUAllocator();
  ASSERT_NE(a->raw_deleter(), nullptr);
  for (size_t n : {size_t{100}, size_t{3} << 20}) {
    void* p = a->raw_allocate(n);
    ASSERT_NE(p, nullptr);
    static_cast<char*>(p)[n - 1] = 1;
    a->raw_deallocate(p);
  }
  const auto before = host_allocator_stats();
  void* again = a->raw_allocate(size_t{3} << 20);
  EXPECT_EQ(host_allocator_stats().hits, before.hits + 1) << "the freed 3 MB block was not reused";
  a->raw_deallocate(again);
  auto t = torch::ones({1 << 20});  // tensors still free through their DataPtr
  EXPECT_EQ(t.sum().item<float>(), float(1 << 20));
}

TEST(Device, HostScalarsReadBackTheValues) {
  const auto t = torch::tensor({1.5, -2.0, std::nan("")}, torch::kDouble);
  for (bool wait : {false, true}) {
    HostScalars h(t, wait);
    const auto v = h.get();
    ASSERT_EQ(v.size(), 3u);
    EXPECT_EQ(v[0], 1.5);
    EXPECT_EQ(v[1], -2.0);
    EXPECT_TRUE(std::isnan(v[2]));
  }
  EXPECT_TRUE(HostScalars().empty());
}

// "" when the CUDA cases can run here, else why not.
std::string cuda_missing() {
  if (!LM_CUDA)
    return "LibTorch " + compat::torch_version() + " was built without CUDA (LM_CUDA=0); bench/gpu.sh runs this on the GPU";
  if (!torch::cuda::is_available()) return "LibTorch has CUDA but no GPU is visible";
  if (!compat::kHasFusedAdamW) return "LibTorch " + compat::torch_version() + " has no at::_fused_adamw_";
  return "";
}

// One, then several, fused CUDA steps equal the CPU flat AdamW steps on the same tensors: the step
// counters are incremented before the kernel (it only reads them), bias corrections match.
TEST(OptimCuda, FusedStepMatchesCpuStep) {
  if (const std::string why = cuda_missing(); !why.empty()) GTEST_SKIP() << why;
#if LM_CUDA
  Twin cpu(torch::kCPU), gpu(torch::Device(torch::kCUDA, 0));
  ASSERT_TRUE(torch::equal(cpu.flat->params(), gpu.flat->params().cpu()));
  for (int k = 0; k < 3; ++k) {
    const auto g = grads_for(k, cpu.flat->numel());
    cpu.flat->grads().copy_(g);
    gpu.flat->grads().copy_(g);
    const double lr = 1e-2 * (k + 1);
    cpu.opt->step(lr);
    gpu.opt->step(lr);
    SCOPED_TRACE("step " + std::to_string(k + 1));
    expect_close(gpu.flat->params(), cpu.flat->params(), "params");
    expect_close(gpu.opt->exp_avg(), cpu.opt->exp_avg(), "exp_avg");
    expect_close(gpu.opt->exp_avg_sq(), cpu.opt->exp_avg_sq(), "exp_avg_sq");
    EXPECT_EQ(gpu.opt->steps(), k + 1);
  }
#endif
}

// found_inf = 1 on the device: the fused kernel leaves everything as it was and the step counter is
// undone; the next step is then the CPU's first.
TEST(OptimCuda, FoundInfSkipsTheFusedStep) {
  if (const std::string why = cuda_missing(); !why.empty()) GTEST_SKIP() << why;
#if LM_CUDA
  const torch::Device dev(torch::kCUDA, 0);
  Twin cpu(torch::kCPU), gpu(dev);
  const auto p0 = gpu.flat->params().clone();
  const auto g = grads_for(0, cpu.flat->numel());
  cpu.flat->grads().copy_(g);
  gpu.flat->grads().copy_(g);
  gpu.opt->step(1e-2, torch::ones({}, torch::TensorOptions().device(dev)));
  EXPECT_TRUE(torch::equal(gpu.flat->params(), p0));
  EXPECT_EQ(gpu.opt->exp_avg().abs().sum().item<double>(), 0.0);
  EXPECT_EQ(gpu.opt->steps(), 0);
  gpu.opt->step(1e-2, torch::zeros({}, torch::TensorOptions().device(dev)));
  cpu.opt->step(1e-2);
  expect_close(gpu.flat->params(), cpu.flat->params(), "params");
  EXPECT_EQ(gpu.opt->steps(), 1);
  EXPECT_EQ(gpu.opt->state().values.at("step").get<int64_t>(), 1);
#endif
}

// A device value queued before later work is read back without waiting for that work.
TEST(OptimCuda, HostScalarsFromTheDevice) {
  if (const std::string why = cuda_missing(); !why.empty()) GTEST_SKIP() << why;
#if LM_CUDA
  const auto t = torch::tensor({3.0, 4.0}, torch::TensorOptions().dtype(torch::kDouble).device(torch::kCUDA, 0));
  HostScalars h(t, /*wait=*/false);
  t.mul_(10);  // queued after the copy: must not show
  EXPECT_EQ(h.get(), (std::vector<double>{3.0, 4.0}));
#endif
}

}  // namespace
}  // namespace lm
