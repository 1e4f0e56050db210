// A parallelism strategy (parallel.h) as a composition of its parts (parts.h): the gradient
// reduction, and optionally the optimizer's shards and the weights' shards. The one implementation
// of Parallelism: what each row of parallel.cpp's table makes, with its name.
#pragma once

#include <memory>
#include <string>

#include "trainer/parallel/parallel.h"
#include "trainer/parallel/parts.h"
#include "trainer/parallel/zero1.h"

namespace lm {

class Strategy : public Parallelism {
 public:
  // shards, weights: nullptr when every rank keeps the whole optimizer state, or all the weights.
  Strategy(std::string name, const ParallelInit& init, std::unique_ptr<OptimizerShards> shards,
           std::unique_ptr<GradReduction> grads, std::unique_ptr<WeightShards> weights = nullptr);

  std::optional<std::vector<FlatRange>> optimizer_ranges() const override;
  bool shards_optimizer() const override { return shards_ != nullptr; }
  // Rank 0's weights to every rank when they are whole (after a resume every rank restored the same
  // ones: one source of truth all the same), then the parts' starts.
  void start() override;
  void before_backward(const MicroStep& m) override;
  void after_micro_backward(const MicroStep& m) override { grads_->after_micro_backward(m); }
  void after_backward(int64_t step) override;
  torch::Tensor grad_norm(int64_t step) override { return grads_->grad_norm(step); }
  // With the optimizer sharded and the weights whole: every rank's updated pieces to every rank.
  void after_update() override;
  std::optional<std::vector<FlatRange>> weights_part() const override;
  torch::Tensor gather_weights(FlatRange r) override { return weights_ ? weights_->gather(r) : torch::Tensor(); }
  void weights_replaced() override {
    if (weights_) weights_->replaced();
  }
  torch::Tensor sum_losses(const std::vector<torch::Tensor>& losses) const override { return grads_->sum_losses(losses); }
  Stateful* checkpointed() override { return grads_->checkpointed(); }
  std::string describe(int64_t optimizer_bytes, const std::string& what) const override;
  std::string name() const override { return name_; }
  // The reduction's facts, the name, and "sharded": what a rank keeps only its pieces of.
  nlohmann::json record() const override;

 private:
  std::string name_;
  Comm* comm_;
  FlatParams& flat_;
  std::unique_ptr<OptimizerShards> shards_;
  std::unique_ptr<GradReduction> grads_;
  std::unique_ptr<WeightShards> weights_;
};

}  // namespace lm
