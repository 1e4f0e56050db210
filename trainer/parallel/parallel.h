// The parallelism seam: the one interface the Trainer and the step call, whatever strategy spreads
// the work over the ranks (dist.zero picks one; registry in parallel.cpp). Nothing outside
// trainer/parallel/ knows which one runs. A strategy decides:
//   - which ranges of the flat parameters this rank's optimizer updates and keeps state for, and
//     whether that state is one part per rank in checkpoints (optimizer_ranges, shards_optimizer);
//   - what the backward's gradients become: hooks launched per bucket while the backward runs
//     (before_backward, after_micro_backward, after_backward), and how the step's micro-batch losses
//     add up on a rank (sum_losses);
//   - the global gradient norm (grad_norm) and what follows the optimizer's update (after_update);
//   - the bytes a rank keeps, for the memory check before anything is built (rank_bytes);
//   - its start-up line (describe) and what meta.json records of it (name, record).
//
// Every strategy is a Strategy (strategy.h) composed of parts (parts.h): a gradient reduction, the
// optimizer's shards and the weights' shards; no strategy derives from another. Adding one: its
// parts (a new reduction scheme is a GradReduction in its own files here) and a row in the table
// in parallel.cpp (when it applies, the bytes it keeps, which parts it is made of). Splitting the
// module itself over ranks is a ModelTransform (transform.h).
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/optim/flat_params.h"
#include "common/torch/stateful.h"
#include "run/config/dist_config.h"
#include "trainer/comm/process_group.h"
#include "trainer/parallel/parts.h"

namespace lm {

class Parallelism {
 public:
  virtual ~Parallelism() = default;
  // The ranges of the flat buffer this rank's optimizer updates and keeps state for (ascending,
  // disjoint); nullopt: all of it.
  virtual std::optional<std::vector<FlatRange>> optimizer_ranges() const { return std::nullopt; }
  // True when each rank saves its own part of the optimizer state (a checkpoint resumes at any
  // world size and strategy all the same); false: every rank holds it whole, rank 0 saves it.
  virtual bool shards_optimizer() const { return false; }
  // Once the state is restored, before the first step: the replicas made equal, hooks installed.
  virtual void start() {}
  // Before each micro-batch's forward and backward (m.last(): the step's last one, the one that
  // communicates in plain data parallelism).
  virtual void before_backward(const MicroStep& /*m*/) {}
  // After each micro-batch's backward, its gradients added into the flat gradient buffer.
  virtual void after_micro_backward(const MicroStep& /*m*/) {}
  // After the step's last backward: the gradients are what this strategy keeps (summed over ranks).
  virtual void after_backward(int64_t /*step*/) {}
  // The global L2 norm of the summed gradients as a 0-dim tensor, or undefined: the flat gradient
  // buffer holds the whole sum on every rank, the norm is taken from it (clip_grad_norm).
  virtual torch::Tensor grad_norm(int64_t /*step*/) { return {}; }
  // After the optimizer updated this rank's ranges, before the EMA reads the weights.
  virtual void after_update() {}
  // The ranges of the weights (and of the buffers laid out as them: the EMA) this rank saves, its own
  // part of a sharded checkpoint component (ZeRO-3: its pieces, the only values it keeps between
  // steps), ascending; nullopt: every rank holds them whole and rank 0 saves them. With a part, a
  // checkpoint's snapshot reads this rank's pieces as they are, and a forward outside the step
  // (validation, tasks) gathers the weights unit by unit inside it, every rank running as many.
  // Asked by ModelParts (model_parts.h) only: the loop never asks which strategy runs.
  virtual std::optional<std::vector<FlatRange>> weights_part() const { return std::nullopt; }
  // With weights_part(): the values of range `r` of the flat weights, whole, in a tensor of their
  // own (every rank calls it with the same ranges in the same order: it communicates), for writing
  // them one tensor at a time. Undefined without a part: they are whole in the flat buffer.
  virtual torch::Tensor gather_weights(FlatRange /*r*/) { return {}; }
  // With weights_part(): this rank's pieces of the weights were written by someone else (the EMA
  // swapped in or out for an evaluation), so nothing gathered from the old values may be read again.
  virtual void weights_replaced() {}
  // This rank's total of its micro-batches' loss values (0-dim tensors, in micro-batch order), as a
  // 0-dim tensor.
  virtual torch::Tensor sum_losses(const std::vector<torch::Tensor>& losses) const = 0;
  // What the strategy keeps in checkpoints (state key "parallel", replicated, optional), or nullptr:
  // nothing.
  virtual Stateful* checkpointed() { return nullptr; }
  // The start-up line: what a rank keeps. optimizer_bytes/what: the optimizer's state on this rank.
  virtual std::string describe(int64_t optimizer_bytes, const std::string& what) const = 0;
  // The strategy's name, its row in parallel.cpp's table ("invariant", "single", "data_parallel",
  // "zero1", "zero2", "zero3").
  virtual std::string name() const = 0;
  // meta.json's "parallelism": {"strategy": name()} and the strategy's facts (the same on every rank).
  virtual nlohmann::json record() const { return {{"strategy", name()}}; }
};

// What a strategy is made from; each outlives it.
struct ParallelInit {
  const DistConfig& dist;
  Comm* comm;  // nullptr: one process, no group
  FlatParams& flat;
  torch::nn::Module& model;
  int rank, world;
  uint64_t seed = 0;       // run.seed
  int64_t grad_accum = 1;  // train.grad_accum: micro-batches per step on each rank
  int64_t micro_batch = 1; // train.micro_batch_size
  // The optimizer needs whole parameters (its row in optimizer_kinds()): a strategy that shards its
  // state gives each rank whole ones (zero1.h, zero_layout).
  bool whole_params = false;
};

// The strategy the config picks for this group (dist.zero; world size 1 without a group: none).
std::unique_ptr<Parallelism> make_parallelism(const ParallelInit& init);

// Bytes one rank keeps for the model's n parameters, before anything is built. grads: what the
// rank keeps of the summed gradients, and while the backward runs (buckets in flight; with
// gradient accumulation, the micro-batches' local sums before the last). stage: the strategy in
// words, for the memory check's refusal ("dist.zero=2 at 4 ranks: ...").
struct RankBytes {
  double weights = 0, grads = 0, optimizer = 0;
  std::string stage;
};
// optimizer_per_param: the optimizer's state bytes per parameter (optimizer_kinds()); grad_accum:
// micro-batches per step (train.grad_accum).
RankBytes rank_bytes(const DistConfig& dist, int world, double n, double optimizer_per_param, int64_t grad_accum = 1);

// Whether the strategy for this config and group keeps the gradients of its pieces only (no flat
// gradient buffer: GradPath::pieces, trainer/optim/flat_params.h), asked before FlatParams is built.
bool grads_in_pieces(const DistConfig& dist, int world, bool has_group);
// Whether it keeps the weights of its pieces only, packed (GradPath::weight_pieces: no buffer of
// every weight; the parameters point into storages it allocates around each use).
bool weights_in_pieces(const DistConfig& dist, int world, bool has_group);

}  // namespace lm
