// The buckets' gradient reduction: plain data parallelism and ZeRO-1 (see bucket_reduction.h).
#include "trainer/parallel/bucket_reduction.h"

#include "common/errors.h"
#include "common/log.h"

namespace lm {

namespace {
// "optimizer state X MB: <what> of every weight<tail>": a rank that keeps the whole state.
std::string whole_state_line(int64_t optimizer_bytes, const std::string& what, const char* tail = "") {
  return strf("optimizer state %.1f MB: %s of every weight%s", optimizer_bytes / 1e6, what.c_str(), tail);
}
}  // namespace

std::string NoReduction::describe(int64_t optimizer_bytes, const std::string& what) const {
  return whole_state_line(optimizer_bytes, what);
}

std::unique_ptr<GradSync> start_grad_sync(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb,
                                          GradSync::Reduce reduce, const std::string& reduce_name) {
  auto sync = std::make_unique<GradSync>(comm, flat, model, plan_buckets(flat, bucket_mb), std::move(reduce), reduce_name);
  log::info(strf("data parallel: %s, %zu gradient buckets of <= %.0f MB", comm.backend().c_str(), sync->num_buckets(),
                 bucket_mb));
  return sync;
}

BucketReduction::BucketReduction(const ParallelInit& init, const OptimizerShards* shards)
    : comm_(*init.comm), flat_(init.flat), model_(init.model), bucket_mb_(init.dist.bucket_mb), rank_(init.rank),
      world_(init.world), shards_(shards) {}

void BucketReduction::start() { sync_ = start_grad_sync(comm_, flat_, model_, bucket_mb_, reduce(), reduce_name()); }

GradSync::Reduce BucketReduction::reduce() {
  if (!shards_ || !shards_->reduce_scatter()) return nullptr;  // all-reduced
  return [this](size_t i, torch::Tensor grads) {
    const ZeroLayout& L = shards_->layout();
    std::vector<std::shared_ptr<Comm::Pending>> work;
    const int64_t s = L.piece_size(i), main = s * L.world;
    if (s > 0) work.push_back(comm_.reduce_scatter_async(grads.narrow(0, 0, main), grads.narrow(0, L.rank * s, s)));
    if (main < grads.numel()) work.push_back(comm_.all_reduce_async(grads.narrow(0, main, grads.numel() - main)));
    return work;
  };
}

torch::Tensor BucketReduction::grad_norm(int64_t step) {
  if (!shards_ || !shards_->reduce_scatter()) return {};
  auto& g = flat_.grads();
  std::vector<torch::Tensor> sq;
  for (const auto& p : shards_->owned()) sq.push_back(g.narrow(0, p.offset, p.numel).pow(2).sum());
  auto total = sq.empty() ? torch::zeros({}, g.options()) : torch::stack(sq).sum();
  comm_.all_reduce_sum(total, strf("all-reduce of the gradient norm's pieces at step %lld", (long long)step));
  return total.sqrt();
}

nlohmann::json BucketReduction::record() const {
  return {{"world_size", world_}, {"bucket_mb", bucket_mb_}, {"reduce", reduce_name()}};
}

std::string BucketReduction::describe(int64_t optimizer_bytes, const std::string& what) const {
  if (!shards_) return whole_state_line(optimizer_bytes, what, world_ > 1 ? ", on every rank (dist.zero: 1 shards them)" : "");
  return strf("zero-1: rank %d keeps %s; gradients %s, weights all-gathered after each update", rank_,
              shards_->describe(optimizer_bytes, what, flat_.numel()).c_str(),
              shards_->reduce_scatter() ? "reduce-scattered" : "all-reduced (the backend has no reduce-scatter: the same sums)");
}

}  // namespace lm
