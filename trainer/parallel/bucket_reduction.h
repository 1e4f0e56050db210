// The buckets' gradient reduction (a part of a strategy, parts.h): plain data parallelism's, and
// ZeRO-1's. The gradients are summed per bucket from the backward's hooks (grad_sync.h) into the
// flat gradient buffer, so communication overlaps the backward: all-reduced (every rank keeps
// every sum), or, with the optimizer's shards on a backend that has it, reduce-scattered (the first
// world*s values of a bucket land on their owners' pieces, the fewer than `world` left over
// all-reduced; zero1.h). One process without a group has nothing to reduce (NoReduction).
#pragma once

#include <memory>
#include <string>

#include "trainer/parallel/grad_sync.h"
#include "trainer/parallel/parallel.h"
#include "trainer/parallel/parts.h"
#include "trainer/parallel/zero1.h"

namespace lm {

// One process without a group.
class NoReduction : public GradReduction {
 public:
  std::string describe(int64_t optimizer_bytes, const std::string& what) const override;
};

class BucketReduction : public GradReduction {
 public:
  // shards: the optimizer's (ZeRO-1), or nullptr. Both outlive it.
  BucketReduction(const ParallelInit& init, const OptimizerShards* shards);
  // The gradient buckets' hooks (logged).
  void start() override;
  void before_backward(const MicroStep& m) override { sync_->begin(m.last()); }
  void after_backward(int64_t step) override { sync_->finish(step); }
  // Reduce-scattered: the global L2 norm from the owned pieces (their sums of squares all-reduced);
  // else undefined (every rank holds the whole sum: the norm is taken as plain data parallelism
  // takes it, the same bits).
  torch::Tensor grad_norm(int64_t step) override;
  std::string describe(int64_t optimizer_bytes, const std::string& what) const override;
  // {"world_size", "bucket_mb", "reduce": what a full bucket's reduction is}.
  nlohmann::json record() const override;

 private:
  GradSync::Reduce reduce();
  std::string reduce_name() const { return shards_ && shards_->reduce_scatter() ? "reduce-scatter" : "all-reduce"; }

  Comm& comm_;
  FlatParams& flat_;
  torch::nn::Module& model_;
  double bucket_mb_;
  int rank_, world_;
  const OptimizerShards* shards_;
  std::unique_ptr<GradSync> sync_;
};

// The GradSync of a strategy's buckets, with the start-up line "data parallel: <backend>, N gradient
// buckets of <= X MB" (the buckets' reduction and ZeRO-2's pieces both start theirs so).
std::unique_ptr<GradSync> start_grad_sync(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb,
                                          GradSync::Reduce reduce, const std::string& reduce_name);

}  // namespace lm
