// Flat parameter storage, gradient clipping and AdamW.
//
// FlatParams moves every parameter of a module into ONE contiguous buffer (and, unless gradients are
// free, every gradient into a second one), so clipping, the optimizer update, zeroing and all-reduce
// buckets each touch one tensor instead of hundreds. Parameters are laid out in REVERSE
// registration order, which is roughly the order backward produces their gradients (so all-reduce
// buckets, which are contiguous ranges, fill up one after another). Each entry records whether it
// is decayed (matrices of Linear layers; not biases, norms, embeddings).
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "trainer/stateful.h"
#include "trainer/optim/optim_config.h"

namespace lm {

// How gradients are kept and clipped (optim.free_grads, optim.clip_in_step; resolve_grad_path).
struct GradPath {
  // Per-parameter .grad tensors, undefined between steps (backward allocates the first and adds the
  // rest), instead of views of one flat buffer zeroed every step.
  bool free_grads = false;
  // The clip coefficient is handed to the fused AdamW as its grad_scale (FlatParams::grad_scale)
  // instead of a pass over the gradients.
  bool clip_in_step = false;
};

// Whether AdamW steps through at::_fused_adamw_ (optim.fused) for parameters on CUDA or the CPU.
// Throws ConfigError naming optim.fused when it is "on" and this LibTorch has no kernel there.
bool resolve_fused(const OptimConfig& cfg, bool cuda);
// optim.free_grads and optim.clip_in_step for a run of `world` ranks (process_group: one is made at
// world size 1 too, dist.backend named): auto = on for CUDA where the fused AdamW runs (free_grads:
// and without a process group). Throws ConfigError naming the key when it is "on" without the fused
// AdamW, or (free_grads) with a process group, whose all-reduce buckets are ranges of the flat
// gradient buffer; and naming optim.fused as resolve_fused does.
GradPath resolve_grad_path(const OptimConfig& cfg, bool cuda, int world, bool process_group = false);

// A range of the flat buffers: [offset, offset + numel).
struct FlatRange {
  int64_t offset, numel;
};

class FlatParams {
 public:
  struct Entry {
    std::string name;
    int64_t offset, numel;
    bool decay;
  };
  // REQUIRES: every parameter of `module` is on the same device and dtype (float32).
  explicit FlatParams(torch::nn::Module& module, GradPath path = {});
  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  const GradPath& path() const { return path_; }
  torch::Tensor& params() { return params_; }  // (numel,)
  const torch::Tensor& params() const { return params_; }
  // (numel,), params' .grad are views of it. REQUIRES: !path().free_grads.
  torch::Tensor& grads();
  // Every parameter's .grad in entries() order (views of grads(), or the free tensors); a free
  // gradient that backward did not produce is set to zeros first (what the flat buffer holds).
  std::vector<torch::Tensor> grad_list();
  int64_t numel() const { return params_.numel(); }
  const std::vector<Entry>& entries() const { return entries_; }
  // Maximal runs of entries with the same decay flag: {offset, numel, decay}.
  const std::vector<Entry>& decay_runs() const { return runs_; }
  // Before a step's backward: the flat buffer zeroed, or every free .grad undefined (its memory
  // released); the pending grad_scale dropped.
  void zero_grad();
  // clip_in_step: what the gradients are still to be divided by (a 0-dim float tensor on the
  // device, set by clip_grad_norm, applied by the fused AdamW); undefined: nothing.
  const torch::Tensor& grad_scale() const { return grad_scale_; }
  void set_grad_scale(torch::Tensor s) { grad_scale_ = std::move(s); }

 private:
  GradPath path_;
  torch::Tensor params_, grads_, grad_scale_;
  std::vector<torch::Tensor> tensors_;  // the parameters, in entries() order
  std::vector<Entry> entries_, runs_;
};

// Scales gradients so their global L2 norm is at most max_norm (no-op when max_norm <= 0): by
// max_norm / (norm + 1e-6) where that is below 1, in place, or with path().clip_in_step, by setting
// flat.grad_scale() to its inverse for the fused AdamW. Returns the norm before clipping as a 0-dim
// tensor (no host sync). norm: the norm already taken elsewhere (ZeRO-1's, from the owned pieces
// of the gradients), or undefined: taken here.
torch::Tensor clip_grad_norm(FlatParams& flat, double max_norm, torch::Tensor norm = {});

// AdamW with decoupled weight decay, the same update as torch.optim.AdamW (non-amsgrad):
//   p *= 1 - lr*wd (decayed entries only); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// optim.fused (optim_config.h) picks at::_fused_adamw_ (CUDA >= 2.1, CPU >= 2.4: the update gated on
// the device by found_inf); else on CPU float32 one fused, multi-threaded pass over the flat
// buffers, on CUDA the same update as tensor ops. With free gradients the fused kernel runs on one
// list entry per parameter (the moments still views of the flat ones) and the step releases the
// gradients; with clip_in_step it divides them by flat.grad_scale().
//
// Sharded (ZeRO-1, trainer/ddp/zero.h): constructed with the ranges of the flat buffer this rank
// owns, it keeps the moments of those ranges only, packed one after another, and steps only them
// (the same update of each value: the same bits as the whole buffer's); whoever shards it gathers
// the updated weights afterwards.
class AdamW : public Stateful {
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
  void step(double lr, const torch::Tensor& found_inf = {});
  // Asked before every update writes the parameters and moments (nullptr: none).
  void set_fence(WriteFence* f) { fence_ = f; }
  // True when steps go through at::_fused_adamw_ (optim.fused).
  bool fused() const { return fused_; }
  // Updates taken so far (skipped ones not counted). With the fused path this reads the device
  // counter (a host sync).
  int64_t steps() const;
  // The moments: (numel,) like the flat buffer, or sharded, the owned ranges' values one after another.
  torch::Tensor& exp_avg() { return m_; }
  torch::Tensor& exp_avg_sq() { return v_; }
  bool sharded() const { return sharded_; }
  // Bytes of optimizer state this rank holds (the two moments).
  int64_t state_bytes() const { return (m_.numel() + v_.numel()) * static_cast<int64_t>(m_.element_size()); }
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
