// Flat parameter storage and gradient clipping, shared by every optimizer and parallelism.
//
// FlatParams moves every parameter of a module into ONE contiguous buffer (and, unless gradients are
// free, every gradient into a second one), so clipping, the optimizer update, zeroing and all-reduce
// buckets each touch one tensor instead of hundreds. Parameters are laid out in REVERSE
// registration order, which is roughly the order backward produces their gradients (so all-reduce
// buckets, which are contiguous ranges, fill up one after another). Each entry records whether it
// is decayed (matrices of Linear layers; not biases, norms, embeddings).
#pragma once

#include <torch/torch.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "run/config/optim_config.h"

namespace lm {

// How gradients are kept and clipped (optim.free_grads, optim.clip_in_step; resolve_grad_path).
struct GradPath {
  // Per-parameter .grad tensors, undefined between steps (backward allocates the first and adds the
  // rest), instead of views of one flat buffer zeroed every step.
  bool free_grads = false;
  // The clip coefficient is handed to the fused AdamW as its grad_scale (FlatParams::grad_scale)
  // instead of a pass over the gradients.
  bool clip_in_step = false;
  // The parallelism keeps the summed gradients of the ranges it names only, packed one after another
  // (keep_grad_pieces, grad_pieces()): no flat gradient buffer; backward's per-parameter .grad
  // tensors are handed to the parallelism's reductions and freed by it bucket by bucket (and by
  // zero_grad). Set from the parallelism's table (trainer/parallel/parallel.h grads_in_pieces).
  bool pieces = false;
  // The parallelism keeps the weights of the ranges it names only, packed one after another in
  // params() (keep_weight_pieces): no flat weight buffer of every value; the parameters themselves
  // point into storages the parallelism allocates around each use (ZeRO-3's units). Set from the
  // parallelism's table (trainer/parallel/parallel.h weights_in_pieces).
  bool weight_pieces = false;
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
  // REQUIRES: every parameter of `module` is on the same device and dtype (float32). Parameters that
  // are placeholders (models/lm.h, a deferred build) give their shape only: the buffer holds no
  // values for them until write() puts them there (values_pending() until then).
  explicit FlatParams(torch::nn::Module& module, GradPath path = {});
  FlatParams(const FlatParams&) = delete;
  FlatParams& operator=(const FlatParams&) = delete;

  const GradPath& path() const { return path_; }
  // Parameter `param`'s values (whole, its shape, any device), the parts of `keep` copied in (the
  // ranges of the flat buffer this rank keeps, ascending; null: all of it). With every parameter
  // written, values_pending() turns false.
  void write(const torch::Tensor& param, const torch::Tensor& values, const std::vector<FlatRange>* keep = nullptr);
  // Parameters that were placeholders and are not written yet (their names, at most `max` of them).
  bool values_pending() const { return std::find(written_.begin(), written_.end(), 0) != written_.end(); }
  std::vector<std::string> pending_names(size_t max = 3) const;
  // The weights: (numel,) laid out as the entries, the parameters views of it; or with
  // path().weight_pieces the kept ranges' values one after another (weight_index maps).
  torch::Tensor& params() { return params_; }
  const torch::Tensor& params() const { return params_; }
  // path().weight_pieces: only `ranges` (ascending, disjoint) of the weights are kept, packed in
  // params() (allocated here: the values written so far, and those of parameters that are not
  // placeholders, copied in); the parameters are left to whoever keeps them between uses.
  void keep_weight_pieces(std::vector<FlatRange> ranges);
  bool weights_packed() const { return path_.weight_pieces; }
  const std::vector<FlatRange>& weight_piece_ranges() const { return weight_ranges_; }
  // Where flat value `offset` sits in params(): at `offset`, or packed, its place among the kept
  // ranges (REQUIRES: inside one).
  int64_t weight_index(int64_t offset) const;
  // (numel,), params' .grad are views of it. REQUIRES: !path().free_grads and !path().pieces.
  torch::Tensor& grads();
  // path().pieces: the summed gradients of `ranges` (ascending, disjoint), packed one after another
  // (allocated here, zeroed); grad_pieces() holds them once the parallelism wrote them.
  void keep_grad_pieces(std::vector<FlatRange> ranges);
  torch::Tensor& grad_pieces() { return pieces_; }
  const std::vector<FlatRange>& grad_piece_ranges() const { return piece_ranges_; }
  // The parameters' tensors in entries() order (their .grad per parameter with path().pieces).
  std::vector<torch::Tensor>& tensors() { return tensors_; }
  // Every parameter's .grad in entries() order (views of grads(), or the free tensors); a free
  // gradient that backward did not produce is set to zeros first (what the flat buffer holds).
  std::vector<torch::Tensor> grad_list();
  int64_t numel() const { return numel_; }  // every parameter's values, kept here or not
  // The weights' dtype and device (whether or not this rank keeps a buffer of them).
  const torch::TensorOptions& options() const { return options_; }
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
  torch::Tensor params_, grads_, grad_scale_, pieces_;
  std::vector<FlatRange> piece_ranges_;
  std::vector<FlatRange> weight_ranges_;  // path_.weight_pieces: the kept ranges of the weights
  std::vector<int64_t> weight_at_;        // their offsets in params_
  int64_t numel_ = 0;
  torch::TensorOptions options_;
  std::vector<torch::Tensor> tensors_;  // the parameters, in entries() order
  std::vector<Entry> entries_, runs_;
  std::unordered_map<const void*, size_t> index_;  // parameter (TensorImpl) -> entry
  std::vector<char> written_;                      // per entry: has its values (not a placeholder's)
};

// The L2 norm of the gradients (not in pieces) as a 0-dim tensor: on the CPU this project's own
// (FlatNorm, the bits every parallelism reproduces), elsewhere LibTorch's norm.
torch::Tensor flat_grad_norm(FlatParams& flat);

// Scales gradients so their global L2 norm is at most max_norm (no-op when max_norm <= 0): by
// max_norm / (norm + 1e-6) where that is below 1, in place, or with path().clip_in_step, by setting
// flat.grad_scale() to its inverse for the fused AdamW. Returns the norm before clipping as a 0-dim
// tensor (no host sync). norm: the norm already taken elsewhere (the parallelism's, e.g. from the owned pieces
// of the gradients), or undefined: taken here (REQUIRES: defined with path().pieces; the pieces are
// what is scaled then).
torch::Tensor clip_grad_norm(FlatParams& flat, double max_norm, torch::Tensor norm = {});

}  // namespace lm
