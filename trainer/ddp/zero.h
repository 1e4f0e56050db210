// ZeRO-1 (dist.zero: 1), as llm.c's and Megatron-LM's distributed optimizer do it: every gradient
// bucket is cut into world_size pieces and rank r keeps the AdamW moments of piece r of each
// bucket only (1/world_size of the optimizer state). Gradients are summed per bucket from the
// autograd hooks as in plain data parallelism (trainer/ddp/grad_sync.h), so the communication still
// overlaps the backward: reduce-scattered where the backend has it (NCCL: each rank gets the sums
// of its pieces only), all-reduced where it does not (Gloo in LibTorch 1.13 and 2.6: every rank gets
// every sum, the same numbers as plain data parallelism, and keeps its pieces). Each rank steps
// its pieces (AdamW, constructed with owned()), then every rank's updated pieces of the weights go
// to every rank, in place (gather_params). The weights, the gradient buffer and the EMA stay whole on
// every rank (ZeRO-1 shards the optimizer state only).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/ddp/process_group.h"
#include "trainer/optim/adamw.h"

namespace lm {

// Which values of the flat buffer each rank owns. Bucket b of n values, s = n / world_size (floor):
// rank r owns [offset + r*s, offset + (r+1)*s), the last rank up to the bucket's end (also the
// n - world_size*s values left over, fewer than world_size), so the first world_size*s values
// reduce-scatter in place and the rest is all-reduced.
struct ZeroLayout {
  std::vector<FlatRange> buckets;  // the gradient buckets (plan_buckets), in flat order
  int rank = 0, world = 1;

  int64_t piece_size(size_t b) const { return buckets[b].numel / world; }  // s
  FlatRange piece(size_t b, int r) const;
  // This rank's pieces, ascending, empty ones left out: the ranges its AdamW updates.
  std::vector<FlatRange> owned() const;
  int64_t owned_numel() const;
};

// The gradient buckets of a flat buffer: contiguous ranges of whole parameters of at most
// bucket_mb (one parameter per bucket when it is bigger), in flat order. The one cut GradSync and
// ZeroLayout share.
std::vector<FlatRange> plan_buckets(const FlatParams& flat, double bucket_mb);

// What the step does differently under ZeRO-1, over the run's process group.
class ZeroShards {
 public:
  // reduce_scatter: the backend reduce-scatters (NCCL), or LM_ZERO_REDUCE_SCATTER=1 asks Gloo to
  // behave as if it did (tests: an all-reduce of a copy, the owned pieces kept), so that only the
  // owned pieces hold the summed gradients.
  ZeroShards(Comm& comm, FlatParams& flat, ZeroLayout layout);
  const ZeroLayout& layout() const { return layout_; }
  bool reduce_scatter() const { return reduce_scatter_; }
  // The global L2 norm of the summed gradients as a 0-dim tensor: with reduce-scatter, from the
  // owned pieces (their sums of squares all-reduced); else undefined (every rank holds the whole
  // sum: the norm is taken as plain data parallelism takes it, the same bits).
  torch::Tensor grad_norm(int64_t step);
  // After this rank's AdamW updated its pieces: every rank's pieces to every rank, in place
  // (NCCL: an all-gather per bucket; Gloo: a broadcast per piece), no scratch buffer.
  void gather_params();
  // The start-up line: what is sharded, this rank's optimizer state against the whole.
  std::string describe(int64_t state_bytes) const;

 private:
  Comm& comm_;
  FlatParams& flat_;
  ZeroLayout layout_;
  std::vector<FlatRange> owned_;  // layout_.owned()
  bool nccl_;
  bool reduce_scatter_;
};

}  // namespace lm
