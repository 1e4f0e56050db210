// dist.invariant: the same bits on any number of ranks (a gradient reduction, a part of a strategy:
// parts.h). The global batch is G = world size x train.grad_accum micro-batches; global
// micro-batch i is the same samples at any world size (the loader's step blocks, loader.h) and rank
// r holds the contiguous block [r*A, (r+1)*A) of them (A = grad_accum). Their gradients are added in
// ONE binary tree over the G indices whatever the world size: the perfect tree over G leaves padded
// to a power of two, an empty subtree passing its sibling through (TreeSum). With A a power of two
// every rank's block is a whole subtree: the rank adds its micro-batches' gradients in tree order as
// they come (a stash of one partial sum per tree level; a + b is exact for two operands and
// commutative, so only the grouping matters), then the ranks' subtree sums are all-gathered per
// gradient bucket and every rank adds them in the same tree. Every rank thus holds the same bits as
// one rank running all G micro-batches, and the loss normalisation, clipping, the non-finite skip,
// the EMA and AdamW see them. Dropout masks come from the default generator reseeded before each
// micro-batch from (run seed, step, global micro-batch index), not the rank.
//
// The loss values a rank reports are added in double (each micro-batch's float value converted):
// sums of a few float32 values of like magnitude are exact in double, so the ranks' sums add up to
// the same bits in any grouping.
//
// Cost: no overlap of communication with the backward (the sums are taken after the last
// micro-batch), one copy of the gradients per tree level held on each rank (log2 A + 1), and the
// combine receives (W-1) x the gradient bytes per rank (all-gather) or log2 W x (recursive
// doubling, power-of-two W; global_batch.h), where a ring all-reduce moves 2 (W-1)/W x.
//
// The rules of the global batch (the deal, the seeds, the losses' tree, the checkpointed shape) and
// the tree itself live in global_batch.h; this reduction runs them for dist.zero 0 and 1 (with the
// optimizer's shards at 1: zero1.h). ZeRO-2 and 3 run them too, bucket by bucket from the
// backward's hooks (piece_reduction.h).
#pragma once

#include <torch/torch.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/parallel/global_batch.h"
#include "trainer/parallel/parallel.h"
#include "trainer/parallel/parts.h"
#include "trainer/parallel/zero1.h"

namespace lm {

class TreeReduction : public GradReduction {
 public:
  // Throws ConfigError naming train.grad_accum when it is not a power of two at world size > 1,
  // optim.free_grads when the gradients are not one flat buffer. shards: the optimizer's under
  // dist.zero 1 at world size > 1 (rank r steps its pieces of the gradient buckets; the tree's sums
  // are whole on every rank, and AdamW updates each value alone, so the bits are the same), or
  // nullptr; it outlives this.
  TreeReduction(const ParallelInit& init, const OptimizerShards* shards);
  // Reseeds the default generators from (seed, step, global micro-batch index).
  void before_backward(const MicroStep& m) override;
  // The micro-batch's gradients into the stash (tree order), the flat buffer zeroed for the next.
  void after_micro_backward(const MicroStep& m) override;
  // The rank's subtree sum, then the ranks' sums all-gathered and added in the tree, into the flat
  // gradient buffer (the same bits on every rank).
  void after_backward(int64_t step) override;
  torch::Tensor sum_losses(const std::vector<torch::Tensor>& losses) const override { return batch_.sum_losses(losses); }
  Stateful* checkpointed() override { return batch_.checkpointed(); }
  std::string describe(int64_t optimizer_bytes, const std::string& what) const override;
  // {"world_size", "global_micro_batches" G, "micro_batch_size", "tree_leaves" (G padded to a power
  // of two), "deal" (per rank its [first, last) of the global micro-batch indices:
  // data::step_block), "combine" (how the ranks' subtree sums meet: "all-gather" or
  // "recursive-doubling"; one rank: "none")}.
  nlohmann::json record() const override;

  // The global batch in micro-batches (world size x grad_accum).
  int64_t global_micro_batches() const { return batch_.global_micro_batches(); }

 private:
  Comm* comm_;
  FlatParams& flat_;
  int rank_, world_;
  GlobalBatch batch_;
  std::vector<FlatRange> buckets_;  // the all-gather's pieces (plan_buckets)
  Combine combine_ = Combine::kNone;  // how the ranks' subtree sums meet (global_batch.h)
  const OptimizerShards* shards_;  // dist.zero 1: the pieces of the optimizer state
  TreeSum local_;
};

}  // namespace lm
