// ZeRO-1: the layout, the sharded gradient norm and the all-gather of the weights (see zero.h).
#include "trainer/ddp/zero.h"

#include <cstdlib>
#include <cstring>

#include "common/log.h"

namespace lm {

FlatRange ZeroLayout::piece(size_t b, int r) const {
  const auto& bucket = buckets[b];
  const int64_t s = piece_size(b);
  const int64_t begin = bucket.offset + r * s;
  const int64_t end = r == world - 1 ? bucket.offset + bucket.numel : begin + s;
  return {begin, end - begin};
}

std::vector<FlatRange> ZeroLayout::owned() const {
  std::vector<FlatRange> out;
  for (size_t b = 0; b < buckets.size(); ++b)
    if (auto p = piece(b, rank); p.numel > 0) out.push_back(p);
  return out;
}

int64_t ZeroLayout::owned_numel() const {
  int64_t n = 0;
  for (const auto& p : owned()) n += p.numel;
  return n;
}

std::vector<FlatRange> plan_buckets(const FlatParams& flat, double bucket_mb) {
  const int64_t elem = static_cast<int64_t>(flat.params().element_size());
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1e6 / elem));
  std::vector<FlatRange> buckets;
  for (const auto& e : flat.entries()) {
    if (buckets.empty() || buckets.back().numel + e.numel > cap) buckets.push_back({e.offset, 0});
    buckets.back().numel += e.numel;
  }
  return buckets;
}

ZeroShards::ZeroShards(Comm& comm, FlatParams& flat, ZeroLayout layout)
    : comm_(comm), flat_(flat), layout_(std::move(layout)), owned_(layout_.owned()), nccl_(comm.backend() == "nccl") {
  const char* emulate = std::getenv("LM_ZERO_REDUCE_SCATTER");
  reduce_scatter_ = nccl_ || (emulate && std::strcmp(emulate, "1") == 0);
}

torch::Tensor ZeroShards::grad_norm(int64_t step) {
  if (!reduce_scatter_) return {};
  auto& g = flat_.grads();
  std::vector<torch::Tensor> sq;
  for (const auto& p : owned_) sq.push_back(g.narrow(0, p.offset, p.numel).pow(2).sum());
  auto total = sq.empty() ? torch::zeros({}, g.options()) : torch::stack(sq).sum();
  comm_.all_reduce_sum(total, strf("all-reduce of the gradient norm's pieces at step %lld", (long long)step));
  return total.sqrt();
}

void ZeroShards::gather_params() {
  torch::NoGradGuard ng;
  auto& p = flat_.params();
  // In place, no scratch (not even one bucket's: on the CPU a freed buffer stays in the caching
  // allocator). NCCL: each bucket's first world*s values all-gathered in place, the fewer than
  // `world` left over broadcast by the last rank, which owns them. Gloo (no in-place all-gather):
  // each piece broadcast by its owner into every rank's weights.
  std::vector<std::shared_ptr<Comm::Pending>> pending;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    const auto& bucket = layout_.buckets[b];
    const int64_t s = layout_.piece_size(b), main = s * layout_.world;
    if (nccl_) {
      if (s > 0) pending.push_back(comm_.all_gather_in_place_async(p.narrow(0, bucket.offset, main)));
      if (main < bucket.numel)
        pending.push_back(comm_.broadcast_async(p.narrow(0, bucket.offset + main, bucket.numel - main), layout_.world - 1));
      continue;
    }
    for (int r = 0; r < layout_.world; ++r)
      if (const auto piece = layout_.piece(b, r); piece.numel > 0)
        pending.push_back(comm_.broadcast_async(p.narrow(0, piece.offset, piece.numel), r));
  }
  for (auto& w : pending) comm_.wait(w, "all-gather of the updated weights");
}

std::string ZeroShards::describe(int64_t state_bytes) const {
  const double whole = 2.0 * static_cast<double>(flat_.numel()) * static_cast<double>(flat_.params().element_size());
  return strf("zero-1: rank %d keeps the AdamW moments of %lld of %lld weights (%zu bucket pieces): optimizer state %.1f MB of %.1f MB; "
              "gradients %s, weights all-gathered after each update",
              layout_.rank, (long long)layout_.owned_numel(), (long long)flat_.numel(), owned_.size(),
              static_cast<double>(state_bytes) / 1e6, whole / 1e6,
              reduce_scatter_ ? "reduce-scattered" : "all-reduced (the backend has no reduce-scatter: the same sums)");
}

}  // namespace lm
