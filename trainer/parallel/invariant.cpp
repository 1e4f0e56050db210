// dist.invariant: the fixed summation tree (see invariant.h).
#include "trainer/parallel/invariant.h"

#include "common/checksum.h"
#include "common/errors.h"
#include "common/log.h"
#include "data/loader/loader.h"
#include "trainer/parallel/grad_sync.h"

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

// ---- Invariant ---------------------------------------------------------------------------------

Invariant::Invariant(const ParallelInit& init)
    : comm_(init.comm), flat_(init.flat), rank_(init.rank), world_(init.world), seed_(init.seed),
      accum_(init.grad_accum), micro_batch_(init.micro_batch),
      buckets_(plan_buckets(init.flat, init.dist.bucket_mb)) {
  if (flat_.path().free_grads)
    throw ConfigError("key 'optim.free_grads': dist.invariant adds the gradients in the flat buffer; set optim.free_grads=off");
  if (world_ > 1 && !power_of_two(accum_))
    throw ConfigError(strf("key 'train.grad_accum': dist.invariant at world size %d needs a power of two (each rank's "
                           "micro-batches a whole subtree of the sum), got %lld",
                           world_, static_cast<long long>(accum_)));
  if (init.dist.zero > 1)
    throw ConfigError(strf("key 'dist.zero': dist.invariant adds the gradients in its tree after the backward; ZeRO-%lld "
                           "reduces them bucket by bucket during it; set dist.zero=1 or 0",
                           static_cast<long long>(init.dist.zero)));
  if (init.dist.zero == 1 && comm_ && world_ > 1) {
    zero_ = ZeroLayout{buckets_, rank_, world_};
    nccl_ = comm_->backend() == "nccl";
  }
  state_.self = this;
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

void Invariant::before_backward(const MicroStep& m) {
  // The micro-batch's global index: the loader's deal (the same block the loader gives this rank).
  const auto global = static_cast<uint64_t>(data::step_block(rank_, m.count).at(m.index));
  const uint64_t ints[4] = {seed_, static_cast<uint64_t>(m.step), global,
                            0x1D5EEDull};  // the last: salt, a stream apart from the init's
  torch::manual_seed(xxh64(ints, sizeof ints));
}

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
  TreeSum ranks;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const auto& r = buckets_[b];
    auto all = comm_->all_gather(mine.narrow(0, r.offset, r.numel),
                                 strf("all-gather of gradient bucket %zu/%zu at step %lld", b + 1, buckets_.size(),
                                      static_cast<long long>(step)));
    for (int w = 0; w < world_; ++w) ranks.push(all.narrow(0, w * r.numel, r.numel), /*borrowed=*/false);
    g.narrow(0, r.offset, r.numel).copy_(ranks.finish());
  }
  local_.recycle(mine);
}

torch::Tensor Invariant::sum_losses(const std::vector<torch::Tensor>& losses) const {
  TreeSum t;
  for (const auto& l : losses) t.push(l.to(torch::kDouble).clone(), /*borrowed=*/false);
  auto root = t.finish();
  return root.defined() ? root : torch::zeros({}, torch::kDouble);
}

nlohmann::json Invariant::record() const {
  nlohmann::json deal = nlohmann::json::array();
  for (int r = 0; r < world_; ++r) {
    const auto b = data::step_block(r, accum_);
    deal.push_back({b.first, b.last});
  }
  nlohmann::json j = {{"strategy", name()},
                      {"world_size", world_},
                      {"global_micro_batches", global_micro_batches()},
                      {"micro_batch_size", micro_batch_},
                      {"tree_leaves", padded_leaves(global_micro_batches())},
                      {"deal", deal},
                      {"combine", world_ > 1 ? "all-gather" : "none"}};
  if (zero_) j["sharded"] = {"optimizer_state"};  // dist.zero 1: as zero1 records it
  return j;
}

std::string Invariant::describe(int64_t optimizer_bytes, const std::string& what) const {
  const int64_t G = global_micro_batches();
  const auto mine = data::step_block(rank_, accum_);
  const double grad_mb = static_cast<double>(flat_.numel()) * 4 / 1e6;
  return strf("invariant: the global batch is %lld micro-batches of %lld rows (world size %d x train.grad_accum %lld), "
              "their gradients added in one binary tree over the %lld indices (padded to %lld); rank %d holds micro-batches "
              "[%lld, %lld), dropout seeded per global micro-batch; %s; optimizer state %.1f MB: %s of %s",
              (long long)G, (long long)micro_batch_, world_, (long long)accum_, (long long)G, (long long)padded_leaves(G),
              rank_, (long long)mine.first, (long long)mine.last,
              world_ > 1 ? strf("the ranks' subtree sums all-gathered in %zu buckets (%.1f MB received per step; a ring "
                                "all-reduce: %.1f MB) and added in the same tree",
                                buckets_.size(), grad_mb * (world_ - 1), grad_mb * 2 * (world_ - 1) / world_)
                               .c_str()
                         : "one rank",
              optimizer_bytes / 1e6, what.c_str(),
              zero_ ? strf("%lld of %lld weights (dist.zero=1: its pieces of the %zu buckets), weights all-gathered after "
                           "each update",
                           (long long)zero_->owned_numel(), (long long)flat_.numel(), buckets_.size())
                          .c_str()
                    : world_ > 1 ? "every weight, on every rank" : "every weight");
}

ComponentState Invariant::State::state() const {
  return {{{"global_micro_batches", self->global_micro_batches()}, {"micro_batch_size", self->micro_batch_}}, {}};
}

void Invariant::State::load_state(const ComponentState* st) {
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
