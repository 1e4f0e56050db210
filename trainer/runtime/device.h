// Device-specific pieces, the only translation unit with CUDA headers (compiled where LibTorch has
// CUDA): batch upload, memory and hardware facts. (MFU peaks: trainer/telemetry/mfu.h.)
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lm {

// Makes `device` this thread's current CUDA device and returns it; call before any other CUDA work
// (every rank would otherwise create its context, streams and NCCL communicator on cuda:0). Throws
// ConfigError when the index is not a visible device. No-op on CPU.
torch::Device use_device(const torch::Device& device);
// train.device `device` (auto | cpu | cuda) for the rank with this local rank, made current
// (use_device). Throws ConfigError when cuda is asked for and LibTorch has none, and when bf16
// (train.dtype bf16) asks for CPU autocast that this LibTorch lacks (< 2.4).
torch::Device pick_device(const std::string& device, bool bf16, int local_rank);
// The device's math settings for the run: set_math_threads(threads, train.threads) when > 0; 0 on CPU means
// one thread (OpenBLAS's pool of one thread per core was ~1.35x faster on an idle 2-core machine
// and ~19x slower beside two busy processes: see set_math_threads; train.threads: 2 asks for it). Debian's 1.13 starts with one
// thread, 2.x with one per core, so it is set, not left to the version. 0 on CUDA keeps LibTorch's
// default; CUDA runs fp32 matmuls on TF32.
// deterministic (dist.invariant): on CUDA also deterministic_kernels().
void configure_math(int64_t threads, const torch::Device& device, bool deterministic = false);
// The kernel switches of the test hooks (common/test_hooks.h: LM_TEST_MKLDNN=0 turns oneDNN off), so a
// test process and every trainer it starts run the kernels a CPU without AVX-512 picks; configure_math
// calls it, the test suites call it at start (tests/kernel_hooks.cpp). A user's run sets none.
void apply_kernel_test_hooks();
// What LibTorch offers to make a CUDA run's kernels give the same bits every time at the same shapes
// (dist.invariant keeps every micro-batch's shape whatever the world size, so cuBLAS and cuDNN pick
// the same kernels): CUBLAS_WORKSPACE_CONFIG=:4096:8 (unless set; read when cuBLAS first starts),
// deterministic algorithms (warn_only: an operation without a deterministic kernel warns instead of
// failing the run), cuDNN deterministic and its benchmark (per-run autotuning) off. Returns the line
// the run's log shows.
std::string deterministic_kernels();
// n math threads. Where LibTorch calls OpenBLAS (Debian's builds), n is OpenBLAS's pool, whose
// sgemm splits each product over it, and LibTorch's intra-op pool is one thread: both pools
// threaded spin against each other (4x4 layers of 256 on 2 cores, 30 steps, idle: 93 ms a step with
// LibTorch 1 + OpenBLAS 2, 250 ms with 2 + 2, 128 ms with 1 + 1). torch::set_num_threads does not
// reach OpenBLAS's pool, which starts with one thread per core: left so, every product's caller
// spins (sched_yield) until the other thread has done its share, and beside busy processes a step
// waited for a descheduled thread (2.6 s a step instead of 0.13, beside two busy loops on 2 cores).
// Elsewhere (MKL, CUDA builds) n is LibTorch's intra-op pool. No-op for n <= 0.
void set_math_threads(int64_t n);
// "device: cuda:0, LibTorch 2.6.0, 1 threads, world size 2" for the log.
std::string describe_runtime(const torch::Device& device, int world);

// Host batches to device tensors. On CPU the tensor wraps the loader's buffer (no copy). On CUDA
// the batch is staged in pinned memory and copied host-to-device with a non_blocking copy on a
// side stream; the compute stream waits on an event, so the copy overlaps compute already queued.
class BatchUploader {
 public:
  explicit BatchUploader(const torch::Device& device);
  ~BatchUploader();
  // (rows, cols) int64 on the device. On CPU it aliases `data`, which must outlive the tensor.
  torch::Tensor upload(std::vector<int64_t>& data, int64_t rows, int64_t cols);

 private:
  struct Cuda;
  torch::Device device_;
  std::unique_ptr<Cuda> cuda_;
};

// Memory in MB: CUDA peak allocated since the last reset, or this process's CPU resident set.
double memory_mb(const torch::Device& device);
void reset_peak_memory(const torch::Device& device);
// The most memory held so far, in MB: CUDA's peak allocated since the last reset, or this process's
// peak resident set (VmHWM) on the CPU.
double peak_memory_mb(const torch::Device& device);
// Bytes a new allocation can still get: CUDA free memory, or MemAvailable (capped by the cgroup's
// memory.max) on CPU; 0 when unknown.
double available_memory_bytes(const torch::Device& device);

// The accelerator for meta.json: model, driver, CUDA and NCCL versions, count; empty on CPU.
struct GpuInfo {
  std::string model, driver, cuda, nccl;
  int count = 0;
};
GpuInfo gpu_info(const torch::Device& device);

// The CUDA generator's state (what CUDA dropout draws from), as bytes; undefined tensor on CPU.
torch::Tensor cuda_rng_state(const torch::Device& device);
void set_cuda_rng_state(const torch::Device& device, const torch::Tensor& state);

// A few device values copied to host memory without waiting: on CUDA a non_blocking copy into
// pinned memory on the current stream plus an event, so get() waits for that copy only (not for
// work queued after it); on CPU a plain copy. Lets the host read step statistics one step late
// instead of stalling the device queue every step.
class HostScalars {
 public:
  HostScalars() = default;
  // values: 1-D, any device. wait: block until the copy is done (the values are wanted now).
  HostScalars(const torch::Tensor& values, bool wait);
  bool empty() const { return !host_.defined(); }
  std::vector<double> get() const;  // waits for the copy; REQUIRES: !empty()

 private:
  torch::Tensor host_;
  std::shared_ptr<void> ready_;  // CUDA: the event recorded after the copy
};

// Waits for queued device work (for timing). No-op on CPU.
void synchronize(const torch::Device& device);

}  // namespace lm
