// Two strategies of the parallelism seam (parallel.h): one process without a group, and plain data
// parallelism (every rank keeps all weights, gradients and optimizer state; the gradients summed
// per bucket from the backward's hooks, trainer/parallel/grad_sync.h).
#pragma once

#include <memory>
#include <string>

#include "trainer/parallel/grad_sync.h"
#include "trainer/parallel/parallel.h"

namespace lm {

class SingleProcess : public Parallelism {
 public:
  explicit SingleProcess(const ParallelInit&) {}
  std::string describe(int64_t optimizer_bytes, const std::string& what) const override;
  std::string name() const override { return "single"; }
};

class DataParallel : public Parallelism {
 public:
  explicit DataParallel(const ParallelInit& init);
  // Rank 0's parameters broadcast to every rank (after a resume every rank restored the same ones:
  // one source of truth all the same; not with a weights_part(): no rank holds them whole), then the
  // gradient buckets' hooks (logged).
  void start() override;
  void before_backward(const MicroStep& m) override { sync_->begin(m.last()); }
  void after_backward(int64_t step) override { sync_->finish(step); }
  std::string describe(int64_t optimizer_bytes, const std::string& what) const override;
  std::string name() const override { return "data_parallel"; }
  // {"strategy", "world_size", "bucket_mb", "reduce": what a full bucket's reduction is}.
  nlohmann::json record() const override;

 protected:
  // What a full bucket's reduction is (GradSync::Reduce; nullptr: all-reduced) and its name.
  virtual GradSync::Reduce reduce() { return nullptr; }
  virtual std::string reduce_name() const { return "all-reduce"; }

  Comm& comm_;
  FlatParams& flat_;
  torch::nn::Module& model_;
  double bucket_mb_;
  int rank_, world_;
  std::unique_ptr<GradSync> sync_;
};

}  // namespace lm
