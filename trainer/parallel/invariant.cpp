// dist.invariant: the fixed summation tree (see invariant.h).
#include "trainer/parallel/invariant.h"

#include "common/errors.h"
#include "common/log.h"
#include "trainer/parallel/grad_sync.h"

namespace lm {

// ---- Invariant ---------------------------------------------------------------------------------

Invariant::Invariant(const ParallelInit& init)
    : comm_(init.comm), flat_(init.flat), rank_(init.rank), world_(init.world), batch_(init),
      buckets_(plan_buckets(init.flat, init.dist.bucket_mb)) {
  if (flat_.path().free_grads)
    throw ConfigError("key 'optim.free_grads': dist.invariant adds the gradients in the flat buffer; set optim.free_grads=off");
  combine_ = pick_combine(world_);
  if (init.dist.zero == 1 && comm_ && world_ > 1) {
    zero_ = zero_layout(buckets_, flat_, rank_, world_, init.whole_params);
    nccl_ = comm_->backend() == "nccl";
  }
}

std::optional<std::vector<FlatRange>> Invariant::optimizer_ranges() const {
  if (!zero_) return std::nullopt;
  return zero_->owned();
}

void Invariant::after_update() {
  if (zero_) gather_pieces(*zero_, *comm_, nccl_, flat_.params());
}

void Invariant::start() {
  if (comm_ && world_ > 1) comm_->broadcast(flat_.params(), 0, "broadcast of the initial parameters");
}

void Invariant::before_backward(const MicroStep& m) { batch_.seed(m); }

void Invariant::after_micro_backward(const MicroStep&) {
  auto& g = flat_.grads();
  local_.push(g, /*borrowed=*/true);
  torch::NoGradGuard ng;
  g.zero_();
}

void Invariant::after_backward(int64_t step) {
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

nlohmann::json Invariant::record() const {
  nlohmann::json j = {{"strategy", name()}, {"world_size", world_}};
  batch_.record(j);
  j["combine"] = combine_name(combine_);
  if (zero_) j["sharded"] = {"optimizer_state"};  // dist.zero 1: as zero1 records it
  return j;
}

std::string Invariant::describe(int64_t optimizer_bytes, const std::string& what) const {
  const double grad_mb = static_cast<double>(flat_.numel()) * 4 / 1e6;
  return strf("invariant: %s; %s; optimizer state %.1f MB: %s of %s", batch_.describe().c_str(),
              combine_ != Combine::kNone ? combine_line(combine_, buckets_.size(), grad_mb, world_).c_str() : "one rank",
              optimizer_bytes / 1e6, what.c_str(),
              zero_ ? strf("%lld of %lld weights (dist.zero=1: its pieces of the %zu buckets), weights all-gathered after "
                           "each update",
                           (long long)zero_->owned_numel(), (long long)flat_.numel(), buckets_.size())
                          .c_str()
                    : world_ > 1 ? "every weight, on every rank" : "every weight");
}

}  // namespace lm
