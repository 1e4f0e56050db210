// The weights' shards (a part of a strategy, parts.h): ZeRO-3 (dist.zero: 3) is ZeRO-2's parts (the
// optimizer's shards, zero1.h, and the gradients kept as pieces, piece_reduction.h) with these:
// fully sharded weights. Between steps rank r
// keeps only its pieces of the weights (ZeroLayout: its piece of every gradient bucket, the same
// pieces its AdamW owns, so the optimizer steps them in place and nothing else moves after the
// update). The model is cut into units (models/lm.h UnitHooks): each transformer block, and the rest
// (embeddings, final norm, head). A unit's weights are gathered just before its forward (every
// piece broadcast by its owner into every rank's storage of the unit, asynchronously; the next block's
// gather issued at once so that it overlaps this block's compute), released after it, gathered
// again when its output's gradient arrives (before its backward, or its recompute under activation
// checkpointing; the block below is prefetched), and released once the backward has accumulated the
// gradients of all its parameters. The rest is gathered from hidden() until its last gradient.
//
// Storage, the same on CPU and CUDA: this rank's pieces live packed one after another in the flat
// parameters' buffer (FlatParams::keep_weight_pieces: what the optimizer, the EMA and checkpoints
// read and write); there is no buffer of every weight. Each unit has a storage of its own, which its
// parameters are views of: allocated by the allocator when the unit is gathered (its owners' pieces
// broadcast into it, this rank's copied from the packed buffer) and handed back when it is released
// (compat::release_storage, PyTorch FSDP's resize to 0): the parameters, and the tensors autograd
// saved of them, keep pointing at the storage (no version counter moves), which holds nothing until
// the next gather. The caching allocators (the host one on CPU, CUDA's) give the same blocks back
// step after step. The gathers run on the process group's stream (NCCL's own on a device).
//
// Gradients as ZeRO-2 keeps them (piece_reduction.h: each bucket's sums reduced as the backward fills it, the
// rank's pieces kept, the bucket freed; the norm streamed: the same sums and norm as plain data
// parallelism, bit for bit), so between steps a rank keeps 1/W of the weights, the gradients and the
// moments. Checkpoints save each rank's pieces of the weights and of the EMA as they are, one part
// per rank (weights_part); the final weights are written one tensor at a time, each gathered alone
// (gather_weights); the validation and task forwards gather unit by unit as the steps do (the ranks
// in lockstep; the EMA's pieces swapped in, weights_replaced). Nothing makes all the weights whole
// on a rank at once.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/torch/compat.h"
#include "models/lm.h"
#include "trainer/comm/process_group.h"
#include "trainer/parallel/parallel.h"
#include "trainer/parallel/parts.h"
#include "trainer/parallel/zero1.h"

namespace lm {

class UnitShards : public WeightShards {
 public:
  // This rank keeps the weights of the optimizer's shards only. Throws ConfigError (dist.zero) for
  // a model that is not an LM. REQUIRES: init.flat with GradPath::weight_pieces; shards outlives it.
  UnitShards(const ParallelInit& init, const OptimizerShards& shards);
  ~UnitShards() override;
  // The gradients' hooks that release a unit, and the model's unit hooks.
  void start() override;
  void before_backward(const MicroStep& m) override;
  void after_backward(int64_t step) override;
  // Its pieces (the optimizer's ranges): checkpoints save them as they are, one part per rank.
  std::vector<FlatRange> part() const override { return shards_.owned(); }
  // Range `r` gathered into a tensor of its own: each owner broadcasts its values of it.
  torch::Tensor gather(FlatRange r) override;
  // Every unit released: the next forward gathers the pieces as they are now.
  void replaced() override;
  std::string describe() const override;

  // The model's unit hooks (models/lm.h), through an adapter the model holds.
  void unit_before_forward(size_t unit);
  void unit_after_forward(size_t unit);
  void unit_before_backward(size_t unit);

 private:
  struct Source {
    FlatRange flat;     // values of the flat parameters
    int64_t local = 0;  // where they sit in the unit's storage
    int owner = 0;      // the rank that keeps them and broadcasts them
  };
  struct Unit {
    std::vector<FlatRange> ranges;   // its parameters' values, merged, ascending
    std::vector<int64_t> range_at;   // where each range starts in its storage
    std::vector<Source> sources;     // what each owner broadcasts into it, in the same order on every rank
    torch::Tensor store;             // (numel,): its parameters are views of it; memory only while gathered
    int64_t numel = 0;
    int params = 0, pending_grads = 0;  // its parameters; those whose gradient this backward still owes
    enum State { kReleased, kInFlight, kGathered } state = kReleased;
    std::vector<std::shared_ptr<Comm::Pending>> work;
  };
  void issue(size_t u);
  void ready(size_t u);
  void release(size_t u, bool force = false);
  void grad_accumulated(size_t u);
  void note_held();

  const ZeroLayout& layout() const { return shards_.layout(); }

  Comm& comm_;
  FlatParams& flat_;
  torch::nn::Module& model_;
  const OptimizerShards& shards_;  // the pieces this rank keeps
  LMImpl* lm_;
  std::vector<Unit> units_;  // blocks, then the rest
  size_t blocks_ = 0;
  std::vector<size_t> unit_of_entry_;
  bool whole_ = true;  // not started: no hook installed, nothing to release
  int64_t gathered_ = 0, peak_gathered_ = 0, logged_peak_ = -1;  // values of gathered units
  int64_t peak_held_ = 0;  // bytes: the packed pieces and every unit storage holding memory, at most
  std::vector<std::pair<compat::AutogradNodePtr, uintptr_t>> hooks_;
};

}  // namespace lm
