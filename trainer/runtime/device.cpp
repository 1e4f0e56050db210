// Device-specific pieces (see device.h). CUDA code only where LibTorch has CUDA.
#include "trainer/runtime/device.h"

#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <mutex>

#include "common/compat.h"
#include "common/errors.h"
#include "common/log.h"
#if LM_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#if defined(USE_C10D_NCCL)
#include <torch/csrc/distributed/c10d/NCCLUtils.hpp>
#endif
#endif

namespace lm {

torch::Device use_device(const torch::Device& device) {
  if (!device.is_cuda()) return device;
  const int count = static_cast<int>(torch::cuda::device_count());
  if (device.index() < 0 || device.index() >= count)
    throw ConfigError(strf("key 'train.device': %s (LOCAL_RANK) but %d CUDA device(s) are visible (CUDA_VISIBLE_DEVICES)",
                           device.str().c_str(), count));
#if LM_CUDA
  c10::cuda::set_device(device.index());
#endif
  return device;
}

#if LM_CUDA
struct BatchUploader::Cuda {
  explicit Cuda(c10::DeviceIndex index) : side(c10::cuda::getStreamFromPool(/*isHighPriority=*/false, index)) {}
  c10::cuda::CUDAStream side;  // a side stream of the uploader's device (not the current one)
};
#else
struct BatchUploader::Cuda {};
#endif

BatchUploader::BatchUploader(const torch::Device& device) : device_(device) {
#if LM_CUDA
  if (device_.is_cuda()) cuda_ = std::make_unique<Cuda>(device_.index());
#endif
}

BatchUploader::~BatchUploader() = default;

torch::Tensor BatchUploader::upload(std::vector<int64_t>& data, int64_t rows, int64_t cols) {
  auto host = torch::from_blob(data.data(), {rows, cols}, torch::kLong);
  if (device_.is_cpu()) return host;
#if LM_CUDA
  if (cuda_) {
    // Pinned staging (PyTorch's caching host allocator keeps the block until the copy is done).
    auto pinned = torch::empty({rows, cols}, torch::TensorOptions().dtype(torch::kLong).pinned_memory(true));
    std::memcpy(pinned.data_ptr(), data.data(), data.size() * sizeof(int64_t));
    auto compute = c10::cuda::getCurrentCUDAStream(device_.index());
    torch::Tensor out;
    {
      c10::cuda::CUDAStreamGuard guard(cuda_->side);
      out = pinned.to(device_, /*non_blocking=*/true);
    }
    at::cuda::CUDAEvent copied;
    copied.record(cuda_->side);
    copied.block(compute);
    // `out` was allocated on the side stream and is used on the compute stream.
    c10::cuda::CUDACachingAllocator::recordStream(out.storage().data_ptr(), compute);
    return out;
  }
#endif
  return host.to(device_);
}

}  // namespace lm

namespace lm {

double memory_mb(const torch::Device& device) {
#if LM_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[0].peak) / 1e6;
  }
#endif
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1e3;  // kB
  return 0;
}

double available_memory_bytes(const torch::Device& device) {
#if LM_CUDA
  if (device.is_cuda()) {
    size_t free = 0, total = 0;
    return cudaMemGetInfo(&free, &total) == cudaSuccess ? static_cast<double>(free) : 0;
  }
#endif
  double avail = 0;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) avail = std::atof(line.c_str() + 13) * 1e3;  // kB
  std::ifstream cg("/sys/fs/cgroup/memory.max");  // a container's limit, when lower
  std::string limit;
  if (cg >> limit && limit != "max" && std::atof(limit.c_str()) > 0) avail = std::min(avail, std::atof(limit.c_str()));
  return avail;
}

void reset_peak_memory(const torch::Device& device) {
#if LM_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

GpuInfo gpu_info(const torch::Device& device) {
  GpuInfo g;
#if LM_CUDA
  if (!device.is_cuda()) return g;
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) g.model = prop.name;
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess) g.driver = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  if (cudaRuntimeGetVersion(&v) == cudaSuccess) g.cuda = std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  cudaGetDeviceCount(&g.count);
#if defined(USE_C10D_NCCL)
  g.nccl = c10d::getNcclVersion();
#endif
  // nvidia-smi knows the driver's own version string.
  if (FILE* p = ::popen("nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null", "r")) {
    char buf[128] = {0};
    if (std::fgets(buf, sizeof buf, p)) {
      std::string d = buf;
      while (!d.empty() && (d.back() == '\n' || d.back() == ' ')) d.pop_back();
      if (!d.empty()) g.driver = d;
    }
    ::pclose(p);
  }
#endif
  return g;
}

double builtin_peak_tflops(const std::string& gpu_model, const std::string& dtype) {
  struct Peak {
    const char* name;
    double bf16, fp32;  // dense tensor-core bf16; fp32 via TF32 tensor cores
  };
  static const Peak kPeaks[] = {{"H200", 989, 494}, {"H100", 989, 494}, {"A100", 312, 156}};
  for (const auto& p : kPeaks)
    if (gpu_model.find(p.name) != std::string::npos) return dtype == "bf16" ? p.bf16 : p.fp32;
  return 0;
}

torch::Tensor cuda_rng_state(const torch::Device& device) {
#if LM_CUDA
  if (device.is_cuda()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    return gen.get_state();
  }
#endif
  return {};
}

void set_cuda_rng_state(const torch::Device& device, const torch::Tensor& state) {
#if LM_CUDA
  if (device.is_cuda() && state.defined()) {
    at::Generator gen = at::cuda::detail::getDefaultCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  }
#endif
}

HostScalars::HostScalars(const torch::Tensor& values, bool wait) {
  const auto flat = values.detach().reshape({-1});
#if LM_CUDA
  if (flat.is_cuda()) {
    host_ = torch::empty(flat.sizes(), flat.options().device(torch::kCPU).pinned_memory(true));
    host_.copy_(flat, /*non_blocking=*/true);
    auto event = std::make_shared<at::cuda::CUDAEvent>();
    event->record(c10::cuda::getCurrentCUDAStream(flat.device().index()));
    if (wait) event->synchronize();
    ready_ = event;
    return;
  }
#endif
  host_ = flat.to(torch::kCPU).clone();
}

std::vector<double> HostScalars::get() const {
#if LM_CUDA
  if (ready_) static_cast<at::cuda::CUDAEvent*>(ready_.get())->synchronize();
#endif
  const auto d = host_.to(torch::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

void synchronize(const torch::Device& device) {
#if LM_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
#endif
}

}  // namespace lm
