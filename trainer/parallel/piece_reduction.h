// The gradients kept as the rank's pieces (a part of a strategy, parts.h): ZeRO-2 (dist.zero: 2) is
// the optimizer's shards (zero1.h) with this reduction, so that a rank keeps the summed gradients of
// its own pieces only (4N/world bytes instead of 4N); ZeRO-3 adds the weights' shards (zero3.h). There is no flat gradient buffer (GradPath::pieces,
// trainer/optim/flat_params.h): backward leaves each parameter's gradient in its own .grad; when a
// bucket's last gradient arrives (the autograd hooks of grad_sync.h) its parameters' gradients are
// added into a fresh bucket-sized buffer (0 + g: the bits of plain data parallelism's zeroed flat
// buffer), their .grad freed, and the bucket's reduction launched: NCCL reduce-scatters it (the
// piece lands in this rank's packed gradient buffer); Gloo, which has no reduce-scatter, all-reduces
// it (every rank gets the sums, the same bits as plain data parallelism; LM_ZERO_REDUCE_SCATTER=1
// takes the reduce-scatter path there too). When it completes the rank copies its piece into its
// packed buffer and the bucket buffer is freed: at most kInFlight buckets exist at once (the next
// bucket's launch first completes the oldest), so a rank never holds the whole model's gradients
// at the end of a step's last backward.
//
// Gradient accumulation: the micro-batches before the step's last one accumulate locally in the
// per-parameter .grad tensors (as plain data parallelism does without communicating), so between
// them a rank holds every gradient (4N) like ZeRO-1; only the last backward reduces and frees them.
// torchtitan / FSDP2 reduce-scatter every micro-batch instead (4N/world throughout, one reduction
// per micro-batch, and the sums added in another order than data parallelism's: not its bits);
// Megatron's distributed optimizer keeps full gradients. grad_accum 1: never more than the buckets
// in flight and the gradients backward has not handed over yet.
//
// The norm for clipping: on the all-reduce path on the CPU every rank sees every bucket's sums, in
// flat order, and feeds them to a FlatNorm (trainer/optim/flat_norm.h: this project's own norm, the
// bits plain data parallelism's flat_grad_norm gives, whatever LibTorch's norm kernel does). On the
// reduce-scatter path (and on CUDA) it is taken from the pieces (their sums of squares all-reduced):
// the same number within float rounding.
//
// Under dist.invariant (global_batch.h, invariant.h) the hooks launch every micro-batch's buckets:
// a bucket's sums (0 + g, the gradients freed) are pushed into that bucket's tree stash in the
// order of the micro-batches; at the step's last micro-batch the bucket's subtree sum is combined
// with the other ranks' (all-gather or recursive doubling, global_batch.h; blocking, from the
// hook: no overlap, as the plain invariant strategy has none),
// the ranks' sums added in the same tree, this rank's piece kept and the norm streamed from the
// whole sums: the bits of dist.invariant with dist.zero 0 at any world size. Memory: between steps
// the pieces as above; during a step of A micro-batches up to log2 A + 1 copies of the gradients
// (the tree's levels), with A = 1 only the bucket being added and its all-gather (W buckets).
#pragma once

#include <torch/torch.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "trainer/optim/flat_norm.h"
#include "trainer/parallel/global_batch.h"
#include "trainer/parallel/parts.h"
#include "trainer/parallel/zero1.h"

namespace lm {

class PieceReduction : public GradReduction {
 public:
  static constexpr size_t kInFlight = 2;  // bucket buffers alive at once
  // REQUIRES: init.flat with GradPath::pieces. shards outlives it.
  PieceReduction(const ParallelInit& init, const OptimizerShards& shards);
  // The gradient buckets' hooks (logged).
  void start() override;
  void before_backward(const MicroStep& m) override;
  void after_micro_backward(const MicroStep& m) override;
  void after_backward(int64_t step) override;
  torch::Tensor grad_norm(int64_t step) override;
  torch::Tensor sum_losses(const std::vector<torch::Tensor>& losses) const override {
    return batch_ ? batch_->sum_losses(losses) : GradReduction::sum_losses(losses);
  }
  Stateful* checkpointed() override { return batch_ ? batch_->checkpointed() : nullptr; }
  bool keeps_pieces() const override { return true; }
  std::string describe(int64_t optimizer_bytes, const std::string& what) const override;
  // {"world_size", "bucket_mb", "reduce"}; under dist.invariant "invariant": true, the global batch's
  // facts (GlobalBatch::record) and "combine": "all-gather".
  nlohmann::json record() const override;

 private:
  GradSync::Reduce reduce();
  std::string reduce_name() const { return shards_.reduce_scatter() ? "reduce-scatter" : "all-reduce"; }
  // Where bucket b's piece of this rank starts in the packed gradients (reduce-scatter: one piece).
  int64_t piece_at(size_t b) const { return mine_[b].empty() ? 0 : mine_[b][0].second; }
  // Under dist.invariant: "invariant: <the global batch>; " (else "").
  std::string invariant_line() const;
  struct InFlight {
    size_t bucket;
    torch::Tensor sums;  // the bucket's buffer
    std::vector<std::shared_ptr<Comm::Pending>> work;
  };
  void complete_oldest();
  // This rank's ranges of bucket i's sums (the whole bucket's, all-reduced) into its packed gradients.
  void keep_mine(size_t i, const torch::Tensor& sums);
  // Bucket i's gradients added into a fresh buffer (0 + g, as the flat buffer holds them), their
  // .grad freed.
  torch::Tensor bucket_sums(size_t i);
  // dist.invariant, the step's last micro-batch: bucket i's subtree sum all-gathered, the ranks'
  // sums added in the tree, this rank's piece kept, the norm fed.
  void combine(size_t i);

  Comm& comm_;
  FlatParams& flat_;
  torch::nn::Module& model_;
  double bucket_mb_;
  const OptimizerShards& shards_;
  const ZeroLayout& layout_;  // shards_.layout()
  std::unique_ptr<GradSync> sync_;
  std::vector<std::vector<std::pair<FlatRange, int64_t>>> mine_;  // bucket -> this rank's ranges and their offsets there
  std::vector<std::pair<size_t, size_t>> entries_of_;  // bucket -> [first, last) of flat.entries()
  std::deque<InFlight> in_flight_;
  // The all-reduce path on the CPU: the norm fed each bucket's sums as it completes (in increasing
  // offsets), the bits plain data parallelism's flat_grad_norm gives.
  bool stream_norm_ = false;
  FlatNorm norm_;
  // dist.invariant only: the global batch's rules, each bucket's tree of the micro-batches' sums,
  // and whether the running micro-batch is the step's last.
  std::unique_ptr<GlobalBatch> batch_;
  Combine combine_ = Combine::kNone;
  std::vector<TreeSum> stash_;
  bool last_ = true;
};

}  // namespace lm
