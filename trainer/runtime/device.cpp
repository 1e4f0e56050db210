// Device-specific pieces (see device.h). CUDA code only where LibTorch has CUDA.
#include "trainer/runtime/device.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "common/torch/compat.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/process.h"
#include "common/test_hooks.h"
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

torch::Device pick_device(const std::string& device, bool bf16, int local_rank) {
  if (device == "cuda" || (device == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available()) throw ConfigError("key 'train.device': cuda requested but LibTorch has no CUDA device");
    return use_device(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank)));  // current from now
  }
  if (bf16 && !compat::kHasCpuAutocast)
    throw ConfigError("key 'train.dtype': bf16 autocast on the CPU needs LibTorch >= 2.4 (this is " +
                      compat::torch_version() + "; train.device=" + device + ")");
  return torch::Device(torch::kCPU);
}

void set_math_threads(int64_t n) {
  if (n <= 0) return;
  using SetThreads = void (*)(int);  // OpenBLAS's, where the process has it (looked up: no link to it)
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(static_cast<int>(n));
    torch::set_num_threads(1);
  } else {
    torch::set_num_threads(static_cast<int>(n));
  }
}

void apply_kernel_test_hooks() {
  if (test_hooks().mkldnn_off) at::globalContext().setUserEnabledMkldnn(false);
}

void configure_math(int64_t threads, const torch::Device& device, bool deterministic) {
  apply_kernel_test_hooks();
  set_math_threads(threads > 0 ? threads : (device.is_cpu() ? 1 : 0));
  if (device.is_cuda()) at::globalContext().setFloat32MatmulPrecision("high");  // TF32 for fp32 matmuls
  if (device.is_cuda() && deterministic) log::info(deterministic_kernels());
}

std::string deterministic_kernels() {
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  auto& ctx = at::globalContext();
  ctx.setDeterministicAlgorithms(true, /*warn_only=*/true);
  ctx.setDeterministicCuDNN(true);
  ctx.setBenchmarkCuDNN(false);
  return strf("deterministic kernels (dist.invariant): CUBLAS_WORKSPACE_CONFIG=%s, deterministic algorithms "
              "(warn only), cuDNN deterministic, cuDNN benchmark off",
              std::getenv("CUBLAS_WORKSPACE_CONFIG"));
}

std::string describe_runtime(const torch::Device& device, int world) {
  using GetThreads = int (*)();  // OpenBLAS's pool (set_math_threads), where the process has it
  const auto openblas = reinterpret_cast<GetThreads>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return strf("device: %s, LibTorch %s, %d threads%s, world size %d", device.str().c_str(),
              compat::torch_version().c_str(), torch::get_num_threads(),
              openblas ? strf(" (OpenBLAS %d)", openblas()).c_str() : "", world);
}

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

double peak_memory_mb(const torch::Device& device) {
  if (device.is_cuda()) return memory_mb(device);
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::atof(line.c_str() + 6) / 1e3;  // kB
  return 0;
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
  std::string d;
  if (run_command({"nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"}, "", &d, 10) == 0) {
    d = d.substr(0, d.find('\n'));
    while (!d.empty() && d.back() == ' ') d.pop_back();
    if (!d.empty()) g.driver = d;
  }
#endif
  return g;
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
