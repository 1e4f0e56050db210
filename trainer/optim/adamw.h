// AdamW over the flat parameters (flat_params.h), one implementation of the optimizer seam
// (optimizer.h).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "trainer/optim/flat_params.h"
#include "trainer/optim/optimizer.h"

namespace lm {

// AdamW with decoupled weight decay, the same update as torch.optim.AdamW (non-amsgrad):
//   p *= 1 - lr*wd (decayed entries only); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// optim.fused (optim_config.h) picks at::_fused_adamw_ (CUDA >= 2.1, CPU >= 2.4: the update gated on
// the device by found_inf); else on CPU float32 one fused, multi-threaded pass over the flat
// buffers, on CUDA the same update as tensor ops. With free gradients the fused kernel runs on one
// list entry per parameter (the moments still views of the flat ones) and the step releases the
// gradients; with clip_in_step it divides them by flat.grad_scale().
//
// Sharded (the parallelism's optimizer_ranges(), trainer/parallel/parallel.h): constructed with the ranges of the flat buffer this rank
// owns, it keeps the moments of those ranges only, packed one after another, and steps only them
// (the same update of each value: the same bits as the whole buffer's); whoever shards it gathers
// the updated weights afterwards.
// Adam's update of weights w from gradients g with moments m and v, as tensor ops (no weight decay):
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= step_size * m / (sqrt(v)/bc2_sqrt + eps), with
// step_size = lr / (1 - b1^t) and bc2_sqrt = sqrt(1 - b2^t). AdamW's update off the CPU float32
// loop, and Muon's for what is not a hidden matrix.
void adam_update(torch::Tensor w, const torch::Tensor& g, torch::Tensor m, torch::Tensor v, double b1, double b2,
                 double eps, double step_size, double bc2_sqrt);

class AdamW : public Optimizer {
 public:
  // Throws ConfigError naming optim.fused when it is "on" and this LibTorch has no kernel here.
  // owned: the ranges this rank updates, ascending and disjoint (none: the whole buffer; an empty
  // list: nothing).
  // REQUIRES: flat.path() as resolve_grad_path gives it (free or in-step gradients need the fused
  // AdamW); no owned list with free gradients.
  AdamW(FlatParams& flat, const OptimConfig& cfg, std::optional<std::vector<FlatRange>> owned = std::nullopt);
  // One update. found_inf (optional): a 0-dim float32 tensor on the parameters' device; where it
  // holds 1 the step is skipped entirely (weights, moments and the step count stay as they were).
  // The fused kernel reads it on the device (no host sync); the flat update reads it on the host.
  void step(double lr, const torch::Tensor& found_inf = {}) override;
  // Asked before every update writes the parameters and moments (nullptr: none).
  void set_fence(WriteFence* f) override { fence_ = f; }
  // True when steps go through at::_fused_adamw_ (optim.fused).
  bool fused() const { return fused_; }
  bool gated_on_device() const override { return fused_; }
  // Updates taken so far (skipped ones not counted). With the fused path this reads the device
  // counter (a host sync).
  int64_t steps() const override;
  // The moments: (numel,) like the flat buffer, or sharded, the owned ranges' values one after another.
  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }
  bool sharded() const { return sharded_; }
  std::string state_name() const override { return "the AdamW moments"; }
  // Bytes of optimizer state this rank holds (the two moments).
  int64_t state_bytes() const override { return (m_.numel() + v_.numel()) * static_cast<int64_t>(m_.element_size()); }
  // State under "optimizer": values {kind, step}; tensors "exp_avg/<param>", "exp_avg_sq/<param>",
  // or sharded, the owned part of each parameter's, "exp_avg/<param>[a:b]" (values a..b-1 of the
  // flattened parameter); views into the moments, no copy. load_state takes whole or sliced tensors,
  // from st->tensors and from every shard of st->shards (read one at a time), keeps what this rank
  // owns, and throws CheckpointError naming a tensor that does not fit a parameter, or when the
  // owned values are not covered exactly once.
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  // A piece of an owned range within one decay run: flat offset, numel, offset in the moments.
  struct Segment {
    int64_t offset, numel, state_offset;
    bool decay;
  };
  FlatParams& flat_;
  OptimConfig cfg_;
  torch::Tensor m_, v_;
  std::vector<FlatRange> owned_;
  std::vector<Segment> segments_;  // the owned ranges cut at the decay runs' edges, in flat order
  bool sharded_ = false;
  void fused_step(double lr, const torch::Tensor& found_inf);
  void load_tensors(const NamedTensors& ts, std::vector<int64_t>* covered);

  bool fused_ = false;
  WriteFence* fence_ = nullptr;
  int64_t t_ = 0;       // host step count; the fused path's truth is step_
  torch::Tensor step_;  // fused path: the float step counter on the device, shared by every tensor
};

}  // namespace lm
