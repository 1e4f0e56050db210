// The parts a parallelism strategy is composed of. A strategy (strategy.h) is one of each, put
// together by a row of the table in parallel.cpp, and no part knows another's class:
// - GradReduction: how the backward's gradients become the sums a step keeps: buckets all-reduced
//   or reduce-scattered (bucket_reduction.h), kept as the rank's pieces (piece_reduction.h, ZeRO-2
//   and 3), or added in dist.invariant's fixed tree (invariant.h);
// - OptimizerShards (zero1.h): which values' optimizer state a rank keeps (equal pieces of every
//   bucket, or whole parameters for an optimizer that needs them), and how the updated weights
//   reach the other ranks; none: every rank keeps it all;
// - WeightShards (zero3.h: UnitShards): a rank keeps only its pieces of the weights between uses,
//   gathering each unit around its use; none: every rank keeps them all.
// How a module is split over ranks (tensor, expert, pipeline parallelism) is a ModelTransform
// (transform.h), applied before any of these.
#pragma once

#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "common/torch/stateful.h"
#include "trainer/optim/flat_params.h"

namespace lm {

// Micro-batch `index` (0-based) of the `count` a rank runs in optimizer step `step` (1-based).
struct MicroStep {
  int64_t step = 1, index = 0, count = 1;
  bool last() const { return index == count - 1; }
};

class GradReduction {
 public:
  virtual ~GradReduction() = default;
  // Once the state is restored, before the first step (the weights are equal on every rank).
  virtual void start() {}
  // Around each micro-batch's forward and backward, and after the step's last backward: then the
  // gradients are what this part keeps (summed over the ranks).
  virtual void before_backward(const MicroStep& /*m*/) {}
  virtual void after_micro_backward(const MicroStep& /*m*/) {}
  virtual void after_backward(int64_t /*step*/) {}
  // The global L2 norm of the summed gradients as a 0-dim tensor, or undefined: taken from the flat
  // gradient buffer (clip_grad_norm).
  virtual torch::Tensor grad_norm(int64_t /*step*/) { return {}; }
  // This rank's total of its micro-batches' loss values; default: added in order from zero.
  virtual torch::Tensor sum_losses(const std::vector<torch::Tensor>& losses) const;
  // What it keeps in checkpoints (state key "parallel"), or nullptr.
  virtual Stateful* checkpointed() { return nullptr; }
  // Whether a rank keeps the summed gradients of its shards only (GradPath::pieces).
  virtual bool keeps_pieces() const { return false; }
  // The start-up line's account of the gradients and the optimizer state (optimizer_bytes/what:
  // the optimizer's state on this rank).
  virtual std::string describe(int64_t optimizer_bytes, const std::string& what) const = 0;
  // Its facts for meta.json's "parallelism" (the strategy adds its name and what is sharded).
  virtual nlohmann::json record() const { return nlohmann::json::object(); }
};

class WeightShards {
 public:
  virtual ~WeightShards() = default;
  // After the gradient reduction's start.
  virtual void start() = 0;
  // After the gradient reduction's.
  virtual void before_backward(const MicroStep& m) = 0;
  virtual void after_backward(int64_t step) = 0;
  // The ranges of the weights this rank keeps (ascending): its part of a sharded checkpoint.
  virtual std::vector<FlatRange> part() const = 0;
  // Range r of the weights, whole, in a tensor of its own (every rank, the same ranges in order).
  virtual torch::Tensor gather(FlatRange r) = 0;
  // This rank's pieces were written by someone else (the EMA swapped in): nothing gathered stays.
  virtual void replaced() = 0;
  // The start of the start-up line.
  virtual std::string describe() const = 0;
};

}  // namespace lm
