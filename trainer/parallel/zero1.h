// The optimizer's shards (a part of a strategy, parts.h), as llm.c's and Megatron-LM's distributed
// optimizer cut them: every gradient bucket is cut into world_size pieces and rank r keeps the
// AdamW moments of piece r of each bucket only (1/world_size of the optimizer state); or, for an
// optimizer that needs whole parameters, each parameter is one rank's. Each rank steps its pieces
// (the optimizer, constructed with optimizer_ranges()), then every rank's updated pieces of the
// weights go to every rank, in place (gather_updated), unless the weights are sharded too (ZeRO-3).
// ZeRO-1 (dist.zero: 1) is these shards with the buckets' reduction (bucket_reduction.h):
// reduce-scattered where the backend has it (NCCL: each rank gets the sums of its pieces only),
// all-reduced where it does not (Gloo in LibTorch 1.13 and 2.6: every rank gets every sum, the same
// numbers as plain data parallelism, and keeps its pieces). The weights, the gradient buffer and
// the EMA stay whole on every rank (ZeRO-1 shards the optimizer state only).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "trainer/optim/flat_params.h"
#include "trainer/parallel/grad_sync.h"
#include "trainer/parallel/parallel.h"

namespace lm {

// Which values of the flat buffer each rank owns, in one of two cuts:
// - pieces (AdamW, any optimizer that updates value by value): bucket b of n values,
//   s = n / world_size (floor): rank r owns [offset + r*s, offset + (r+1)*s), the last rank up to the
//   bucket's end (also the n - world_size*s values left over, fewer than world_size), so the first
//   world_size*s values reduce-scatter in place and the rest is all-reduced;
// - whole parameters (an optimizer whose row in optimizer_kinds() says whole_params: Muon): each
//   parameter owned by one rank, whole, the largest first to the rank holding the fewest values so
//   far (ties: the lowest rank), the same on every rank; a bucket's sums are all-reduced and each
//   rank keeps its parameters' (ranges(b, r)).
struct ZeroLayout {
  std::vector<FlatRange> buckets;  // the gradient buckets (plan_buckets), in flat order
  int rank = 0, world = 1;
  // Whole parameters: [bucket][rank] -> the ranges it owns there, ascending; empty: pieces.
  std::vector<std::vector<std::vector<FlatRange>>> whole = {};

  bool by_pieces() const { return whole.empty(); }
  // What this rank's ranges are, for the start-up line.
  const char* cut() const { return by_pieces() ? "bucket pieces" : "runs of whole parameters"; }
  int64_t piece_size(size_t b) const { return buckets[b].numel / world; }  // s (pieces)
  FlatRange piece(size_t b, int r) const;  // REQUIRES: by_pieces()
  // Rank r's ranges of bucket b, ascending, empty ones left out.
  std::vector<FlatRange> ranges(size_t b, int r) const;
  // This rank's ranges, ascending: the ranges its optimizer updates.
  std::vector<FlatRange> owned() const;
  int64_t owned_numel() const;
};

// The cut for `flat`'s parameters in `buckets` over `world` ranks: whole parameters when
// whole_params (the optimizer's row), else pieces.
ZeroLayout zero_layout(std::vector<FlatRange> buckets, const FlatParams& flat, int rank, int world, bool whole_params);

// After each rank's optimizer updated its pieces of `params` (the flat weights): every rank's pieces
// to every rank, in place, no scratch buffer (NCCL: an all-gather per bucket, the values left over
// broadcast by the last rank; Gloo, which has no in-place all-gather: a broadcast per piece).
void gather_pieces(const ZeroLayout& layout, Comm& comm, bool nccl, const torch::Tensor& params);

// What optimizer state a rank keeps: its ranges of the layout.
class OptimizerShards {
 public:
  // The layout over init's buckets (plan_buckets at dist.bucket_mb), whole parameters when
  // init.whole_params. REQUIRES: a process group.
  explicit OptimizerShards(const ParallelInit& init);
  const ZeroLayout& layout() const { return layout_; }
  const std::vector<FlatRange>& owned() const { return owned_; }  // layout().owned()
  bool nccl() const { return nccl_; }
  // Whether the buckets' sums reduce-scatter onto the pieces: where the backend has it (NCCL), or
  // where LM_ZERO_REDUCE_SCATTER=1 asks Gloo to behave as if it did (tests: an all-reduce of a copy,
  // the owned pieces kept); never for whole parameters (no equal pieces of a bucket).
  bool reduce_scatter() const { return reduce_scatter_; }
  // After this rank's optimizer updated its pieces of `params`: every rank's pieces to every rank,
  // in place (gather_pieces).
  void gather_updated(const torch::Tensor& params) { gather_pieces(layout_, comm_, nccl_, params); }
  // "<what> of N of M weights (K bucket pieces): optimizer state X MB of Y MB" for the start-up line.
  std::string describe(int64_t optimizer_bytes, const std::string& what, int64_t numel) const;

 private:
  Comm& comm_;
  ZeroLayout layout_;
  std::vector<FlatRange> owned_;
  bool nccl_;
  bool reduce_scatter_;
};

}  // namespace lm
