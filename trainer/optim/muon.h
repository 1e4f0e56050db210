// Muon (optim.name=muon; Keller Jordan's, as nanochat and Moonshot run it), one implementation of
// the optimizer seam (optimizer.h), over the flat parameters (flat_params.h).
//
// The hidden matrices (2-D parameters that take weight decay: not embeddings, the head when tied,
// norms or biases) take Muon: a Nesterov momentum buffer, orthogonalised whole by Newton-Schulz,
//   buf = mu buf + g;  u = g + mu buf;  X = NS(u / (|u|_F + 1e-7));  p *= 1 - lr_m wd;
//   p -= lr_m sqrt(max(1, rows / cols)) X,
// NS: optim.muon_ns_steps iterations of X = a X + (b A + c A A) X, A = X X^T, with (a, b, c) =
// (3.4445, -4.7750, 2.0315), on the wide orientation (X^T when rows > cols), in float32.
// lr_m = optim.muon_lr x (the schedule's lr / optim.lr). Every other parameter takes AdamW's update
// (adamw.h) at the schedule's lr, without weight decay.
//
// It needs each matrix whole (its row in optimizer_kinds() says whole_params): under ZeRO the
// parallelism gives each rank whole parameters (trainer/parallel/zero1.h, the whole-tensor layout),
// and a rank steps the ones it owns. No fused kernel, no grad_scale (clipping is a pass of its
// own), no freed gradients: resolve_grad_path never asks those of it.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "trainer/optim/flat_params.h"
#include "trainer/optim/optimizer.h"

namespace lm {

class Muon : public Optimizer {
 public:
  // owned: the ranges this rank updates, each a run of whole parameters (none: all of them). Throws
  // Error when a range cuts a parameter apart (the parallelism must give whole ones).
  Muon(FlatParams& flat, const OptimConfig& cfg, std::optional<std::vector<FlatRange>> owned = std::nullopt);
  void step(double lr, const torch::Tensor& found_inf = {}) override;
  void set_fence(WriteFence* f) override { fence_ = f; }
  bool gated_on_device() const override { return false; }
  int64_t steps() const override { return t_; }
  int64_t state_bytes() const override;
  std::string state_name() const override { return "the Muon momentum and the AdamW moments"; }
  // State under "optimizer": values {kind: "muon", step}; tensors "momentum/<param>[a:b]" (the owned
  // matrices), "exp_avg/<param>[a:b]" and "exp_avg_sq/<param>[a:b]" (the other owned parameters),
  // views (flat_state.h naming). Loads from any world size: each rank keeps what it owns.
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  struct Param {
    int64_t offset, numel;  // in the flat buffer
    int64_t grad_offset;    // in the gradients (the flat buffer, or packed as the owned ranges)
    int64_t state_offset;   // in mom_ (a matrix) or m_ / v_
    int64_t rows = 0, cols = 0;  // a matrix's shape; 0: AdamW's update
  };
  FlatParams& flat_;
  OptimConfig cfg_;
  std::vector<Param> params_;
  std::vector<FlatRange> matrices_, others_;  // the owned parameters by kind, ascending
  torch::Tensor mom_, m_, v_;                 // packed as matrices_ / others_
  WriteFence* fence_ = nullptr;
  int64_t t_ = 0;
};

// The Newton-Schulz orthogonalisation of a 2-D float32 tensor (see above), `steps` iterations.
torch::Tensor newton_schulz(const torch::Tensor& g, int64_t steps);

}  // namespace lm
