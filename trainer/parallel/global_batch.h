// dist.invariant's global batch (see invariant.h): the fixed tree its gradients and losses are
// added in (TreeSum), and the rules every strategy running under the switch shares (GlobalBatch):
// the deal of the G = world size x train.grad_accum micro-batches to the ranks, the dropout seeded
// per global micro-batch, the losses added in the tree, the global batch's shape in checkpoints.
// The fixed tree (TreeReduction, invariant.h) and ZeRO-2/3's pieces (PieceReduction, piece_reduction.h) hold one.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/torch/stateful.h"
#include "trainer/parallel/parallel.h"
#include "trainer/comm/process_group.h"

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

// How the ranks' subtree sums meet (one bucket at a time), the same tree and bits either way:
//   kAllGather: every rank's sums all-gathered, added in the tree on every rank; a rank receives
//               (W-1) x the bucket.
//   kDoubling:  recursive doubling, power-of-two world sizes only: log2 W rounds, in round l the
//               ranks r and r ^ 2^l exchange their sums (point to point) and both add the lower
//               rank's (the left subtree) + the higher's; a rank receives log2 W x the bucket.
// pick_combine: LM_INVARIANT_COMBINE=all-gather|doubling where set (tests, bench/invariant.sh), else
// doubling at a power-of-two world size > 2 (fewer bytes; measured in docs/benchmarks.md), else the
// all-gather.
enum class Combine { kNone, kAllGather, kDoubling };
Combine pick_combine(int world);
const char* combine_name(Combine c);  // "none", "all-gather", "recursive-doubling"
// "the ranks' subtree sums all-gathered in N buckets (X MB received per step; a ring all-reduce:
// Y MB) and added in the same tree" (or "... combined by recursive doubling ..."); grad_mb: the
// gradients' MB.
std::string combine_line(Combine c, size_t buckets, double grad_mb, int world);
// The sum over the ranks of `mine` (this rank's subtree sum of a bucket; written over) in the tree:
// the same bits on every rank.
torch::Tensor sum_over_ranks(Comm& comm, torch::Tensor mine, Combine how, int rank, int world, const std::string& what);

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
