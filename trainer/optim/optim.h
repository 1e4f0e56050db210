// Flat parameter storage, AdamW and the learning-rate schedule.
//
// FlatParams moves every parameter of a module into ONE contiguous buffer (and every gradient into
// a second one), so clipping, the optimizer update, zeroing and all-reduce buckets each touch one
// tensor instead of hundreds. Parameters are laid out in REVERSE registration order, which is
// roughly the order backward produces their gradients (so all-reduce buckets, which are
// contiguous ranges, fill up one after another). Each entry records whether it is decayed
// (matrices of Linear layers; not biases, norms, embeddings).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/optim/optim_config.h"

namespace lm {

class FlatParams {
 public:
  struct Entry {
    std::string name;
    int64_t offset, numel;
    bool decay;
  };
  // REQUIRES: every parameter of `module` is on the same device and dtype (float32).
  explicit FlatParams(torch::nn::Module& module);
  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  torch::Tensor& params() { return params_; }  // (numel,)
  torch::Tensor& grads() { return grads_; }    // (numel,), params' .grad are views of it
  int64_t numel() const { return params_.numel(); }
  const std::vector<Entry>& entries() const { return entries_; }
  // Maximal runs of entries with the same decay flag: {offset, numel, decay}.
  const std::vector<Entry>& decay_runs() const { return runs_; }
  void zero_grad() { grads_.zero_(); }

 private:
  torch::Tensor params_, grads_;
  std::vector<Entry> entries_, runs_;
};

// Scales gradients so their global L2 norm is at most max_norm (no-op when max_norm <= 0).
// Returns the norm before clipping as a 0-dim tensor (no host sync).
torch::Tensor clip_grad_norm(FlatParams& flat, double max_norm);

// AdamW with decoupled weight decay, the same update as torch.optim.AdamW (non-amsgrad):
//   p *= 1 - lr*wd (decayed entries only); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// On CPU float32 one fused, multi-threaded pass over the flat buffers; on CUDA at::_fused_adamw_
// where LibTorch has it (>= 2.1), else the same update as tensor ops.
class AdamW {
 public:
  AdamW(FlatParams& flat, const OptimConfig& cfg);
  void step(double lr);
  int64_t steps() const { return t_; }
  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }
  void set_steps(int64_t t) {
    t_ = t;
    steps_.clear();  // the fused kernel's device-side counters are rebuilt from t_
  }

 private:
  FlatParams& flat_;
  OptimConfig cfg_;
  torch::Tensor m_, v_;
  int64_t t_ = 0;
  std::vector<torch::Tensor> steps_;  // CUDA fused path: per decay run, float step counters
};

// Learning rate at optimizer step `step` (0-based): linear warmup over warmup_steps to optim.lr,
// then cosine / linear decay to lr*min_lr_ratio at decay_steps (default max_steps), or constant.
double lr_at(const ScheduleConfig& s, double peak_lr, int64_t max_steps, int64_t step);

}  // namespace lm
