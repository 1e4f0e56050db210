// dist.invariant's global batch and its tree (see global_batch.h).
#include "trainer/parallel/global_batch.h"

#include <cstdlib>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/test_hooks.h"
#include "data/loader/loader.h"

namespace lm {
namespace {

bool power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

int64_t padded_leaves(int64_t n) {
  int64_t p = 1;
  while (p < n) p *= 2;
  return p;
}

}  // namespace

// ---- TreeSum -----------------------------------------------------------------------------------

torch::Tensor TreeSum::take_buffer(const torch::Tensor& like) {
  if (!free_.empty()) {
    auto b = free_.back();
    free_.pop_back();
    if (b.sizes() == like.sizes() && b.dtype() == like.dtype() && b.device() == like.device()) return b;
  }
  return torch::empty_like(like);
}

void TreeSum::push(const torch::Tensor& leaf, bool borrowed) {
  torch::NoGradGuard ng;
  ++leaves_;
  torch::Tensor carry = leaf;
  size_t k = 0;
  for (; k < level_.size() && level_[k].defined(); ++k) {
    torch::Tensor left = std::move(level_[k]);
    level_[k] = torch::Tensor();
    left.add_(carry);  // left + right: the sibling subtrees of level k
    if (!borrowed) free_.push_back(carry);
    carry = left;
    borrowed = false;
  }
  if (borrowed) carry = take_buffer(leaf).copy_(leaf);
  if (k == level_.size()) level_.emplace_back();
  level_[k] = carry;
}

torch::Tensor TreeSum::finish() {
  torch::NoGradGuard ng;
  // The padded tree: each complete subtree left of the partial sum of everything after it.
  torch::Tensor root;
  for (auto& l : level_) {
    if (!l.defined()) continue;
    if (root.defined()) {
      l.add_(root);
      free_.push_back(root);
    }
    root = l;
    l = torch::Tensor();
  }
  leaves_ = 0;
  return root;
}

// ---- the ranks' sums ---------------------------------------------------------------------------

Combine pick_combine(int world) {
  if (world <= 1) return Combine::kNone;
  const bool doubling_fits = power_of_two(world);
  if (const std::string& s = test_hooks().invariant_combine; !s.empty()) {
    if (s == "all-gather") return Combine::kAllGather;
    if (!doubling_fits)
      throw ConfigError(strf("LM_INVARIANT_COMBINE=doubling needs a power-of-two world size, got %d", world));
    return Combine::kDoubling;
  }
  return doubling_fits && world > 2 ? Combine::kDoubling : Combine::kAllGather;
}

const char* combine_name(Combine c) {
  switch (c) {
    case Combine::kNone: return "none";
    case Combine::kAllGather: return "all-gather";
    case Combine::kDoubling: return "recursive-doubling";
  }
  return "?";
}

std::string combine_line(Combine c, size_t buckets, double grad_mb, int world) {
  int rounds = 0;
  for (int s = 1; s < world; s <<= 1) ++rounds;
  const bool doubling = c == Combine::kDoubling;
  return strf("the ranks' subtree sums %s in %zu buckets (%.1f MB received per step; a ring all-reduce: %.1f MB) and "
              "added in the same tree",
              doubling ? "combined by recursive doubling" : "all-gathered", buckets,
              grad_mb * (doubling ? rounds : world - 1), grad_mb * 2 * (world - 1) / world);
}

torch::Tensor sum_over_ranks(Comm& comm, torch::Tensor mine, Combine how, int rank, int world, const std::string& what) {
  torch::NoGradGuard ng;
  if (how == Combine::kDoubling) {
    for (int s = 1; s < world; s <<= 1) {
      const int partner = rank ^ s;
      auto other = comm.exchange(mine, partner, /*tag=*/s, what);
      if (rank < partner) mine.add_(other);  // mine is the left subtree
      else mine = other.add_(mine);          // the partner's is
    }
    return mine;
  }
  const int64_t n = mine.numel();
  auto all = comm.all_gather(mine, what);
  TreeSum ranks;
  for (int w = 0; w < world; ++w) ranks.push(all.narrow(0, w * n, n), /*borrowed=*/false);
  return ranks.finish();
}

// ---- GlobalBatch -------------------------------------------------------------------------------

GlobalBatch::GlobalBatch(const ParallelInit& init)
    : rank_(init.rank), world_(init.world), seed_(init.seed), accum_(init.grad_accum), micro_batch_(init.micro_batch) {
  if (world_ > 1 && !power_of_two(accum_))
    throw ConfigError(strf("key 'train.grad_accum': dist.invariant at world size %d needs a power of two (each rank's "
                           "micro-batches a whole subtree of the sum), got %lld",
                           world_, static_cast<long long>(accum_)));
  state_.self = this;
}

void GlobalBatch::seed(const MicroStep& m) const {
  // The micro-batch's global index: the loader's deal (the same block the loader gives this rank).
  const auto global = static_cast<uint64_t>(data::step_block(rank_, m.count).at(m.index));
  const uint64_t ints[4] = {seed_, static_cast<uint64_t>(m.step), global,
                            0x1D5EEDull};  // the last: salt, a stream apart from the init's
  torch::manual_seed(xxh64(ints, sizeof ints));
}

torch::Tensor GlobalBatch::sum_losses(const std::vector<torch::Tensor>& losses) const {
  TreeSum t;
  for (const auto& l : losses) t.push(l.to(torch::kDouble).clone(), /*borrowed=*/false);
  auto root = t.finish();
  return root.defined() ? root : torch::zeros({}, torch::kDouble);
}

void GlobalBatch::record(nlohmann::json& j) const {
  nlohmann::json deal = nlohmann::json::array();
  for (int r = 0; r < world_; ++r) {
    const auto b = data::step_block(r, accum_);
    deal.push_back({b.first, b.last});
  }
  j["global_micro_batches"] = global_micro_batches();
  j["micro_batch_size"] = micro_batch_;
  j["tree_leaves"] = padded_leaves(global_micro_batches());
  j["deal"] = deal;
}

std::string GlobalBatch::describe() const {
  const int64_t G = global_micro_batches();
  const auto mine = data::step_block(rank_, accum_);
  return strf("the global batch is %lld micro-batches of %lld rows (world size %d x train.grad_accum %lld), their "
              "gradients added in one binary tree over the %lld indices (padded to %lld); rank %d holds micro-batches "
              "[%lld, %lld), dropout seeded per global micro-batch",
              (long long)G, (long long)micro_batch_, world_, (long long)accum_, (long long)G, (long long)padded_leaves(G),
              rank_, (long long)mine.first, (long long)mine.last);
}

ComponentState GlobalBatch::State::state() const {
  return {{{"global_micro_batches", self->global_micro_batches()}, {"micro_batch_size", self->micro_batch_}}, {}};
}

void GlobalBatch::State::load_state(const ComponentState* st) {
  if (!st) {
    log::warn("dist.invariant: the checkpoint was written without it: the steps from here on are world-size invariant");
    return;
  }
  const int64_t G = st->values.at("global_micro_batches").get<int64_t>();
  const int64_t B = st->values.at("micro_batch_size").get<int64_t>();
  if (B != self->micro_batch_)
    throw ConfigError(strf("key 'train.micro_batch_size': dist.invariant: the checkpoint's micro-batches have %lld rows, "
                           "this run's %lld; set train.micro_batch_size=%lld",
                           (long long)B, (long long)self->micro_batch_, (long long)B));
  if (G == self->global_micro_batches()) return;
  if (G % self->world_ == 0)
    throw ConfigError(strf("key 'train.grad_accum': dist.invariant: the checkpoint's global batch is %lld micro-batches, "
                           "this run's %d x %lld = %lld (world size x train.grad_accum); set train.grad_accum=%lld",
                           (long long)G, self->world_, (long long)self->accum_, (long long)self->global_micro_batches(),
                           (long long)(G / self->world_)));
  throw ConfigError(strf("key 'train.grad_accum': dist.invariant: the checkpoint's global batch of %lld micro-batches does "
                         "not divide over world size %d; run it on a world size dividing %lld",
                         (long long)G, self->world_, (long long)G));
}

}  // namespace lm
