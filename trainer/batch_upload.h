// Host batches to device tensors. On CPU the tensor wraps the loader's buffer (no copy). On CUDA
// the batch is staged in pinned memory and copied host-to-device with a non_blocking copy on a
// side stream; the compute stream waits on an event, so the copy overlaps compute already queued.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

namespace lm {

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

}  // namespace lm
