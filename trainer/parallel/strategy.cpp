// A strategy composed of its parts (see strategy.h).
#include "trainer/parallel/strategy.h"

namespace lm {

torch::Tensor GradReduction::sum_losses(const std::vector<torch::Tensor>& losses) const {
  torch::Tensor sum = torch::zeros({}, (losses.empty() ? torch::TensorOptions() : losses[0].options()).dtype(torch::kFloat));
  for (const auto& l : losses) sum += l;
  return sum;
}

Strategy::Strategy(std::string name, const ParallelInit& init, std::unique_ptr<OptimizerShards> shards,
                   std::unique_ptr<GradReduction> grads, std::unique_ptr<WeightShards> weights)
    : name_(std::move(name)), comm_(init.comm), flat_(init.flat), shards_(std::move(shards)), grads_(std::move(grads)),
      weights_(std::move(weights)) {}

std::optional<std::vector<FlatRange>> Strategy::optimizer_ranges() const {
  if (!shards_) return std::nullopt;
  return shards_->owned();
}

std::optional<std::vector<FlatRange>> Strategy::weights_part() const {
  if (!weights_) return std::nullopt;
  return weights_->part();
}

void Strategy::start() {
  // Kept in pieces, the weights have nothing whole to broadcast: each rank drew or restored its own.
  if (comm_ && !weights_) comm_->broadcast(flat_.params(), 0, "broadcast of the initial parameters");
  grads_->start();
  if (weights_) weights_->start();
}

void Strategy::before_backward(const MicroStep& m) {
  grads_->before_backward(m);
  if (weights_) weights_->before_backward(m);
}

void Strategy::after_backward(int64_t step) {
  grads_->after_backward(step);
  if (weights_) weights_->after_backward(step);
}

void Strategy::after_update() {
  if (shards_ && !weights_) shards_->gather_updated(flat_.params());  // ZeRO-3's pieces are gathered when used
}

std::string Strategy::describe(int64_t optimizer_bytes, const std::string& what) const {
  return (weights_ ? weights_->describe() : std::string()) + grads_->describe(optimizer_bytes, what);
}

nlohmann::json Strategy::record() const {
  nlohmann::json j = grads_->record();
  j["strategy"] = name_;
  nlohmann::json sharded = nlohmann::json::array();
  if (shards_) sharded.push_back("optimizer_state");
  if (grads_->keeps_pieces()) sharded.push_back("gradients");
  if (weights_) sharded.push_back("weights");
  if (!sharded.empty()) j["sharded"] = sharded;
  return j;
}

}  // namespace lm
