// The parallelism strategies by config (see parallel.h): the one table a new strategy is added to.
#include "trainer/parallel/parallel.h"

#include <algorithm>
#include <functional>

#include "common/errors.h"
#include "common/log.h"
#include "trainer/parallel/bucket_reduction.h"
#include "trainer/parallel/invariant.h"
#include "trainer/parallel/piece_reduction.h"
#include "trainer/parallel/strategy.h"
#include "trainer/parallel/zero1.h"
#include "trainer/parallel/zero3.h"

namespace lm {
namespace {

struct Row {
  const char* name;
  // Whether it runs for this config and group (has_group: a process group exists).
  std::function<bool(const DistConfig&, int world, bool has_group)> applies;
  std::function<RankBytes(const DistConfig&, double n, double optimizer_per_param, int world, int64_t accum)> bytes;
  std::function<std::unique_ptr<Parallelism>(const ParallelInit&)> make;
  bool grad_pieces = false;    // the gradients kept as this rank's pieces (GradPath::pieces)
  bool weight_pieces = false;  // the weights kept as this rank's pieces (GradPath::weight_pieces)
};

RankBytes replicated(const DistConfig&, double n, double opt, int world, int64_t) {
  return {4 * n, 4 * n, opt * n, world > 1 ? strf("dist.zero=0 at %d ranks (every rank keeps all weights, gradients and optimizer state)", world)
                                           : std::string("one process")};
}

// ZeRO-2's gradients: its pieces (4N/world), the bucket buffers in flight (PieceReduction::kInFlight) and
// the gradients backward made but not yet handed to a bucket (about one more bucket), or with
// gradient accumulation the micro-batches' local sums (4N) between the micro-batches.
// Under dist.invariant the micro-batches' sums are a tree: up to log2(accum) + 1 copies of the
// gradients between the micro-batches, and with accum 1 the bucket being added and its all-gather.
double zero2_grads(const DistConfig& d, double n, int world, int64_t accum) {
  const double bucket = std::min(4 * n, d.bucket_mb * 1e6);
  if (d.invariant) {
    int levels = 1;
    while ((int64_t{1} << levels) <= accum) ++levels;  // floor(log2 accum) + 1
    return 4 * n / world + (accum > 1 ? levels * 4 * n : std::min(4 * n, (world + 2) * bucket));
  }
  return 4 * n / world + (accum > 1 ? 4 * n : std::min(4 * n, (PieceReduction::kInFlight + 1) * bucket));
}

// ", dist.invariant: ..." for the memory check's line of ZeRO-2 and 3.
std::string invariant_note(const DistConfig& d, int64_t accum) {
  if (!d.invariant) return accum > 1 ? ", all gradients between micro-batches (train.grad_accum > 1)" : "";
  return accum > 1 ? ", dist.invariant: the micro-batches' tree of gradient sums between them (train.grad_accum > 1)"
                   : ", dist.invariant";
}

// In order: the first that applies runs.
const std::vector<Row>& strategies() {
  static const std::vector<Row> table = {
      // ZeRO-2 and 3 run dist.invariant's tree themselves (piece_reduction.h): their rows below.
      {"invariant", [](const DistConfig& d, int world, bool) { return d.invariant && (d.zero < 2 || world == 1); },
       [](const DistConfig& d, double n, double opt, int world, int64_t accum) {
         RankBytes b = replicated(d, n, opt, world, accum);
         if (d.zero == 1 && world > 1) {
           b.optimizer = opt * n / world;
           b.stage = strf("dist.invariant with dist.zero=1 at %d ranks (optimizer state 1/%d per rank, all weights and "
                          "gradients)", world, world);
         } else {
           b.stage = strf("dist.invariant at %d ranks (every rank keeps all weights, gradients and optimizer state)", world);
         }
         return b;
       },
       [](const ParallelInit& in) {  // the fixed tree; with dist.zero 1 at world size > 1, the optimizer's shards
         auto shards = in.dist.zero == 1 && in.comm && in.world > 1 ? std::make_unique<OptimizerShards>(in) : nullptr;
         auto grads = std::make_unique<TreeReduction>(in, shards.get());
         return std::make_unique<Strategy>("invariant", in, std::move(shards), std::move(grads));
       }},
      {"single", [](const DistConfig&, int, bool group) { return !group; }, replicated,
       [](const ParallelInit& in) { return std::make_unique<Strategy>("single", in, nullptr, std::make_unique<NoReduction>()); }},
      {"zero1", [](const DistConfig& d, int world, bool) { return d.zero == 1 && world > 1; },
       [](const DistConfig&, double n, double opt, int world, int64_t) {
         return RankBytes{4 * n, 4 * n, opt * n / world,
                          strf("dist.zero=1 at %d ranks (optimizer state 1/%d per rank, all weights and gradients)", world, world)};
       },
       [](const ParallelInit& in) {  // the optimizer's shards, the buckets reduced
         auto shards = std::make_unique<OptimizerShards>(in);
         auto grads = std::make_unique<BucketReduction>(in, shards.get());
         return std::make_unique<Strategy>("zero1", in, std::move(shards), std::move(grads));
       }},
      {"zero2", [](const DistConfig& d, int world, bool) { return d.zero == 2 && world > 1; },
       [](const DistConfig& d, double n, double opt, int world, int64_t accum) {
         return RankBytes{4 * n, zero2_grads(d, n, world, accum), opt * n / world,
                          strf("dist.zero=2 at %d ranks (gradients and optimizer state 1/%d per rank%s, all weights)", world,
                               world, invariant_note(d, accum).c_str())};
       },
       [](const ParallelInit& in) {  // the optimizer's shards, the gradients kept as pieces
         auto shards = std::make_unique<OptimizerShards>(in);
         auto grads = std::make_unique<PieceReduction>(in, *shards);
         return std::make_unique<Strategy>("zero2", in, std::move(shards), std::move(grads));
       }, /*grad_pieces=*/true},
      {"zero3", [](const DistConfig& d, int world, bool) { return d.zero == 3 && world > 1; },
       [](const DistConfig& d, double n, double opt, int world, int64_t accum) {
         return RankBytes{4 * n / world, zero2_grads(d, n, world, accum), opt * n / world,
                          strf("dist.zero=3 at %d ranks (weights, gradients and optimizer state 1/%d per rank between "
                               "steps%s)", world, world, invariant_note(d, accum).c_str())};
       },
       [](const ParallelInit& in) {  // ZeRO-2's parts and the weights' shards
         auto shards = std::make_unique<OptimizerShards>(in);
         auto grads = std::make_unique<PieceReduction>(in, *shards);
         auto weights = std::make_unique<UnitShards>(in, *shards);
         return std::make_unique<Strategy>("zero3", in, std::move(shards), std::move(grads), std::move(weights));
       }, /*grad_pieces=*/true, /*weight_pieces=*/true},
      {"data_parallel", [](const DistConfig&, int, bool) { return true; }, replicated,
       [](const ParallelInit& in) {  // every rank keeps it all, the buckets all-reduced
         return std::make_unique<Strategy>("data_parallel", in, nullptr, std::make_unique<BucketReduction>(in, nullptr));
       }},
  };
  return table;
}

const Row& pick(const DistConfig& dist, int world, bool has_group) {
  for (const auto& s : strategies())
    if (s.applies(dist, world, has_group)) return s;
  throw Error("no parallelism strategy applies");  // the last one always does
}

}  // namespace

std::unique_ptr<Parallelism> make_parallelism(const ParallelInit& init) {
  return pick(init.dist, init.world, init.comm != nullptr).make(init);
}

RankBytes rank_bytes(const DistConfig& dist, int world, double n, double optimizer_per_param, int64_t grad_accum) {
  // Before the group exists: a group runs at world size > 1 (or a named backend, whose bytes are a
  // single process's all the same).
  return pick(dist, world, world > 1).bytes(dist, n, optimizer_per_param, world, grad_accum);
}

bool grads_in_pieces(const DistConfig& dist, int world, bool has_group) {
  return pick(dist, world, has_group).grad_pieces;
}

bool weights_in_pieces(const DistConfig& dist, int world, bool has_group) {
  return pick(dist, world, has_group).weight_pieces;
}

}  // namespace lm
