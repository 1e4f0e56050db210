// ZeRO-1: the layout, the sharded gradient norm and the all-gather of the weights (see zero1.h).
#include "trainer/parallel/zero1.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "common/test_hooks.h"
#include "common/log.h"

namespace lm {

FlatRange ZeroLayout::piece(size_t b, int r) const {
  const auto& bucket = buckets[b];
  const int64_t s = piece_size(b);
  const int64_t begin = bucket.offset + r * s;
  const int64_t end = r == world - 1 ? bucket.offset + bucket.numel : begin + s;
  return {begin, end - begin};
}

std::vector<FlatRange> ZeroLayout::ranges(size_t b, int r) const {
  if (!by_pieces()) return whole[b][static_cast<size_t>(r)];
  const auto p = piece(b, r);
  return p.numel > 0 ? std::vector<FlatRange>{p} : std::vector<FlatRange>{};
}

std::vector<FlatRange> ZeroLayout::owned() const {
  std::vector<FlatRange> out;
  for (size_t b = 0; b < buckets.size(); ++b)
    for (const auto& p : ranges(b, rank)) out.push_back(p);
  return out;
}

int64_t ZeroLayout::owned_numel() const {
  int64_t n = 0;
  for (const auto& p : owned()) n += p.numel;
  return n;
}

ZeroLayout zero_layout(std::vector<FlatRange> buckets, const FlatParams& flat, int rank, int world, bool whole_params) {
  ZeroLayout l{std::move(buckets), rank, world};
  if (!whole_params) return l;
  const auto& entries = flat.entries();
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return entries[a].numel > entries[b].numel; });
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  std::vector<int> owner(entries.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(r);
    load[r] += entries[i].numel;
  }
  l.whole.assign(l.buckets.size(), std::vector<std::vector<FlatRange>>(static_cast<size_t>(world)));
  size_t b = 0;
  for (size_t i = 0; i < entries.size(); ++i) {  // in flat order: each bucket's ranges ascending, adjacent ones merged
    while (entries[i].offset >= l.buckets[b].offset + l.buckets[b].numel) ++b;
    auto& mine = l.whole[b][static_cast<size_t>(owner[i])];
    if (!mine.empty() && mine.back().offset + mine.back().numel == entries[i].offset) mine.back().numel += entries[i].numel;
    else mine.push_back({entries[i].offset, entries[i].numel});
  }
  return l;
}

void gather_pieces(const ZeroLayout& layout, Comm& comm, bool nccl, const torch::Tensor& params) {
  torch::NoGradGuard ng;
  // In place, no scratch (not even one bucket's: on the CPU a freed buffer stays in the caching
  // allocator).
  std::vector<std::shared_ptr<Comm::Pending>> pending;
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const auto& bucket = layout.buckets[b];
    const int64_t s = layout.piece_size(b), main = s * layout.world;
    if (nccl && layout.by_pieces()) {
      if (s > 0) pending.push_back(comm.all_gather_in_place_async(params.narrow(0, bucket.offset, main)));
      if (main < bucket.numel)
        pending.push_back(comm.broadcast_async(params.narrow(0, bucket.offset + main, bucket.numel - main), layout.world - 1));
      continue;
    }
    for (int r = 0; r < layout.world; ++r)
      for (const auto& piece : layout.ranges(b, r))
        pending.push_back(comm.broadcast_async(params.narrow(0, piece.offset, piece.numel), r));
  }
  for (auto& w : pending) comm.wait(w, "all-gather of the updated weights");
}

OptimizerShards::OptimizerShards(const ParallelInit& init)
    : comm_(*init.comm),
      layout_(zero_layout(plan_buckets(init.flat, init.dist.bucket_mb), init.flat, init.rank, init.world, init.whole_params)),
      owned_(layout_.owned()), nccl_(init.comm->backend() == "nccl") {
  reduce_scatter_ = layout_.by_pieces() && (nccl_ || test_hooks().emulate_reduce_scatter);
}

std::string OptimizerShards::describe(int64_t state_bytes, const std::string& what, int64_t numel) const {
  const double owned = static_cast<double>(layout_.owned_numel());  // the whole state, at this rank's bytes per value
  const double whole = owned > 0 ? static_cast<double>(state_bytes) * static_cast<double>(numel) / owned : 0;
  return strf("%s of %lld of %lld weights (%zu %s): optimizer state %.1f MB of %.1f MB", what.c_str(),
              (long long)layout_.owned_numel(), (long long)numel, owned_.size(), layout_.cut(),
              static_cast<double>(state_bytes) / 1e6, whole / 1e6);
}

}  // namespace lm
