// dist.invariant's global batch (see invariant.h): the fixed tree its gradients and losses are
// added in (TreeSum), and the rules every strategy running under the switch shares (GlobalBatch):
// the deal of the G = world size x train.grad_accum micro-batches to the ranks, the dropout seeded
// per global micro-batch, the losses added in the tree, the global batch's shape in checkpoints.
// The plain strategy (Invariant, invariant.h) and ZeRO-2/3 (zero2.h) hold one.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/torch/stateful.h"
#include "trainer/parallel/parallel.h"

namespace lm {

// Adds tensors pushed in index order in the perfect binary tree over their indices, padded to a
// power of two (an empty subtree passes its sibling through). Operands are added in place into
// the left one.
class TreeSum {
 public:
  // The next leaf. borrowed: `leaf` stays the caller's (copied when it must be kept); else it is
  // taken and may be written.
  void push(const torch::Tensor& leaf, bool borrowed);
  // The root of the leaves pushed so far (undefined when none); starts over.
  torch::Tensor finish();
  int64_t leaves() const { return leaves_; }
  // A buffer finish() returned, to reuse.
  void recycle(torch::Tensor t) { free_.push_back(std::move(t)); }

 private:
  torch::Tensor take_buffer(const torch::Tensor& like);
  std::vector<torch::Tensor> level_;  // level_[k]: a complete subtree of 2^k leaves, or undefined
  std::vector<torch::Tensor> free_;   // buffers to reuse
  int64_t leaves_ = 0;
};

// The global batch's rules under dist.invariant (one per strategy; not copyable: its checkpointed
// state points back at it).
class GlobalBatch {
 public:
  // Throws ConfigError naming train.grad_accum when it is not a power of two at world size > 1
  // (each rank's block of micro-batches must be a whole subtree).
  explicit GlobalBatch(const ParallelInit& init);
  GlobalBatch(const GlobalBatch&) = delete;
  GlobalBatch& operator=(const GlobalBatch&) = delete;

  // Reseeds the default generators from (run seed, step, global micro-batch index): the dropout
  // masks of a micro-batch whatever rank runs it.
  void seed(const MicroStep& m) const;
  // The rank's micro-batch losses added in the tree, in double (see invariant.h).
  torch::Tensor sum_losses(const std::vector<torch::Tensor>& losses) const;
  // The global batch's shape in checkpoints (a resume at another world size must keep it).
  Stateful* checkpointed() { return &state_; }
  // meta.json's facts of it: "global_micro_batches" G, "micro_batch_size", "tree_leaves" (G padded
  // to a power of two), "deal" (per rank its [first, last) of the global indices).
  void record(nlohmann::json& j) const;
  // "the global batch is G micro-batches of B rows (...), their gradients added in one binary tree
  // over the G indices (padded to P); rank r holds micro-batches [a, b), dropout seeded per global
  // micro-batch"
  std::string describe() const;

  int64_t global_micro_batches() const { return accum_ * world_; }
  int64_t micro_batch() const { return micro_batch_; }
  int world() const { return world_; }

 private:
  struct State : Stateful {
    const GlobalBatch* self = nullptr;
    ComponentState state() const override;
    void load_state(const ComponentState* st) override;
  };
  int rank_, world_;
  uint64_t seed_;
  int64_t accum_, micro_batch_;
  State state_;
};

}  // namespace lm
