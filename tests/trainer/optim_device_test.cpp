// AdamW's device paths: the fused CUDA kernel (at::_fused_adamw_) against the CPU flat update, the
// found_inf gate on both, and HostScalars (device values read back late). The CUDA cases compile
// only where LibTorch has CUDA (LM_CUDA) and skip without a GPU: bench/gpu.sh runs them there.
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <cmath>
#include <torch/torch.h>

#include "common/torch/compat.h"
#include "tests/testutil.h"
#include "models/gpt.h"
#include "trainer/optim/adamw.h"
#include "trainer/runtime/device.h"
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
  MfuPeak slow{1e6, "measured while busy", true};  // below any real SGEMM rate
  const double pct = slow.pct(1e7);
  EXPECT_GT(slow.flops, 1e8) << "measured again: LibTorch's 1024^3 SGEMM runs far above 1e6 FLOP/s";
  EXPECT_NEAR(pct, 100.0 * 1e7 / slow.flops, 1e-9);
  EXPECT_FALSE(slow.measured) << "only once: a run still beating it says MFU over 100% in its records";
  const double again = slow.flops;
  EXPECT_DOUBLE_EQ(slow.pct(2 * again), 200.0);
  EXPECT_TRUE(std::isnan(MfuPeak{}.pct(1e9))) << "unknown peak: null in the records";
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
