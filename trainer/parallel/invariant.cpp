// dist.invariant: the fixed summation tree (see invariant.h).
#include "trainer/parallel/invariant.h"

#include "common/errors.h"
#include "common/log.h"
#include "trainer/parallel/grad_sync.h"

namespace lm {

// ---- Invariant ---------------------------------------------------------------------------------

TreeReduction::TreeReduction(const ParallelInit& init, const OptimizerShards* shards)
    : comm_(init.comm), flat_(init.flat), rank_(init.rank), world_(init.world), batch_(init),
      buckets_(plan_buckets(init.flat, init.dist.bucket_mb)), shards_(shards) {
  if (flat_.path().free_grads)
    throw ConfigError("key 'optim.free_grads': dist.invariant adds the gradients in the flat buffer; set optim.free_grads=off");
  combine_ = pick_combine(world_);
}

void TreeReduction::before_backward(const MicroStep& m) { batch_.seed(m); }

void TreeReduction::after_micro_backward(const MicroStep&) {
  auto& g = flat_.grads();
  local_.push(g, /*borrowed=*/true);
  torch::NoGradGuard ng;
  g.zero_();
}

void TreeReduction::after_backward(int64_t step) {
  torch::NoGradGuard ng;
  auto& g = flat_.grads();
  torch::Tensor mine = local_.finish();
  if (!comm_ || world_ == 1) {
    g.copy_(mine);
    local_.recycle(mine);  // its buffer kept for the next step
    return;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& r = buckets_[b];
    g.narrow(0, r.offset, r.numel)
        .copy_(sum_over_ranks(*comm_, mine.narrow(0, r.offset, r.numel), combine_, rank_, world_,
                              strf("%s of gradient bucket %zu/%zu at step %lld", combine_name(combine_), b + 1,
                                   buckets_.size(), static_cast<long long>(step))));
  }
  local_.recycle(mine);
}

nlohmann::json TreeReduction::record() const {
  nlohmann::json j = {{"world_size", world_}};
  batch_.record(j);
  j["combine"] = combine_name(combine_);
  return j;
}

std::string TreeReduction::describe(int64_t optimizer_bytes, const std::string& what) const {
  const double grad_mb = static_cast<double>(flat_.numel()) * 4 / 1e6;
  return strf("invariant: %s; %s; optimizer state %.1f MB: %s of %s", batch_.describe().c_str(),
              combine_ != Combine::kNone ? combine_line(combine_, buckets_.size(), grad_mb, world_).c_str() : "one rank",
              optimizer_bytes / 1e6, what.c_str(),
              shards_ ? strf("%lld of %lld weights (dist.zero=1: its %s of the %zu buckets), weights all-gathered after "
                           "each update",
                           (long long)shards_->layout().owned_numel(), (long long)flat_.numel(),
                           shards_->layout().by_pieces() ? "pieces" : "runs of whole parameters",
                           buckets_.size())
                          .c_str()
                    : world_ > 1 ? "every weight, on every rank" : "every weight");
}

}  // namespace lm
