// Flat parameter storage, gradient clipping and AdamW.
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

#include "trainer/stateful.h"
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
// optim.fused (optim_config.h) picks at::_fused_adamw_ (CUDA >= 2.1, CPU >= 2.4: the update gated on
// the device by found_inf); else on CPU float32 one fused, multi-threaded pass over the flat
// buffers, on CUDA the same update as tensor ops.
class AdamW : public Stateful {
 public:
  AdamW(FlatParams& flat, const OptimConfig& cfg);
  // Throws ConfigError naming optim.fused when it is "on" and this LibTorch has no kernel here.
  // One update. found_inf (optional): a 0-dim float32 tensor on the parameters' device; where it
  // holds 1 the step is skipped entirely (weights, moments and the step count stay as they were).
  // The fused kernel reads it on the device (no host sync); the flat update reads it on the host.
  void step(double lr, const torch::Tensor& found_inf = {});
  // Asked before every update writes the parameters and moments (nullptr: none).
  void set_fence(WriteFence* f) { fence_ = f; }
  // True when steps go through at::_fused_adamw_ (optim.fused).
  bool fused() const { return fused_; }
  // Updates taken so far (skipped ones not counted). With the fused path this reads the device
  // counter (a host sync).
  int64_t steps() const;
  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }
  // State under "optimizer": values {kind, step}; tensors "exp_avg/<param>", "exp_avg_sq/<param>"
  // (views into the flat moments, no copy). load_state throws CheckpointError naming a missing or
  // mis-shaped tensor.
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  FlatParams& flat_;
  OptimConfig cfg_;
  torch::Tensor m_, v_;
  void fused_step(double lr, const torch::Tensor& found_inf);

  bool fused_ = false;
  WriteFence* fence_ = nullptr;
  int64_t t_ = 0;       // host step count; the fused path's truth is step_
  torch::Tensor step_;  // fused path: the float step counter on the device, shared by every tensor
};

}  // namespace lm
