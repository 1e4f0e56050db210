// Host-to-device batch upload (see batch_upload.h). CUDA code only where LibTorch has CUDA.
#include "trainer/batch_upload.h"

#include <cstring>

#include "trainer/compat.h"
#if LM_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace lm {

#if LM_CUDA
struct BatchUploader::Cuda {
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false);
};
#else
struct BatchUploader::Cuda {};
#endif

BatchUploader::BatchUploader(const torch::Device& device) : device_(device) {
#if LM_CUDA
  if (device_.is_cuda()) cuda_ = std::make_unique<Cuda>();
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
