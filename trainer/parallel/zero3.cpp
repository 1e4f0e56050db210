// The weights' shards: units gathered before use and released after, weights kept as pieces (see zero3.h).
#include "trainer/parallel/zero3.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/errors.h"
#include "common/log.h"

namespace lm {
namespace {

struct UnitShardsHooks : UnitHooks {
  explicit UnitShardsHooks(UnitShards* z) : z(z) {}
  void before_forward(size_t u) override { z->unit_before_forward(u); }
  void after_forward(size_t u) override { z->unit_after_forward(u); }
  void before_backward(size_t u) override { z->unit_before_backward(u); }
  UnitShards* z;
};

struct UnitShardsGradHook : torch::autograd::FunctionPostHook {
  explicit UnitShardsGradHook(std::function<void()> fn) : fn(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn();
    return outputs;
  }
  std::function<void()> fn;
};

}  // namespace

UnitShards::UnitShards(const ParallelInit& init, const OptimizerShards& shards)
    : comm_(*init.comm), flat_(init.flat), model_(init.model), shards_(shards),
      lm_(dynamic_cast<LMImpl*>(&init.model)) {
  if (!lm_) throw ConfigError("key 'dist.zero': 3 shards the weights of a language model's units (blocks and the rest); this module is none");
  TORCH_CHECK(flat_.path().weight_pieces, "UnitShards: the flat parameters need GradPath::weight_pieces (parallel.h weights_in_pieces)");
  // The units: each block's parameters, then the rest.
  std::map<const void*, size_t> unit_of_param;
  auto blocks = lm_->block_list();
  blocks_ = blocks->size();
  for (size_t i = 0; i < blocks_; ++i)
    for (auto& p : blocks->ptr(i)->parameters()) unit_of_param[p.unsafeGetTensorImpl()] = i;
  units_.resize(blocks_ + 1);
  std::map<std::string, torch::Tensor> by_name;
  for (auto& p : model_.named_parameters()) by_name[p.key()] = p.value();
  std::vector<int64_t> local_of_entry;  // where each entry sits in its unit's storage
  for (const auto& e : flat_.entries()) {
    auto it = unit_of_param.find(by_name.at(e.name).unsafeGetTensorImpl());
    const size_t u = it == unit_of_param.end() ? blocks_ : it->second;
    auto& unit = units_[u];
    unit_of_entry_.push_back(u);
    local_of_entry.push_back(unit.numel);
    if (unit.ranges.empty() || unit.ranges.back().offset + unit.ranges.back().numel != e.offset) {
      unit.ranges.push_back({e.offset, 0});
      unit.range_at.push_back(unit.numel);
    }
    unit.ranges.back().numel += e.numel;
    unit.numel += e.numel;
    ++unit.params;
  }
  // What each owner broadcasts into each unit: the unit's ranges cut by the owners' ranges, in flat
  // order (the same list on every rank, so the collectives pair up).
  const auto& L = layout();
  for (auto& unit : units_)
    for (size_t i = 0; i < unit.ranges.size(); ++i) {
      const auto& r = unit.ranges[i];
      for (size_t b = 0; b < L.buckets.size(); ++b)
        for (int k = 0; k < L.world; ++k)
          for (const auto& p : L.ranges(b, k)) {
            const int64_t a = std::max(p.offset, r.offset), e = std::min(p.offset + p.numel, r.offset + r.numel);
            if (e > a) unit.sources.push_back({{a, e - a}, unit.range_at[i] + (a - r.offset), k});
          }
    }
  // This rank's pieces packed apart (the values written so far kept), then every parameter a view of
  // its unit's storage, which holds memory only while the unit is gathered.
  flat_.keep_weight_pieces(shards_.owned());
  torch::NoGradGuard ng;
  for (auto& unit : units_) unit.store = torch::empty({unit.numel}, flat_.options());
  const auto& entries = flat_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto& t = by_name.at(entries[i].name);
    t.set_data(units_[unit_of_entry_[i]].store.narrow(0, local_of_entry[i], entries[i].numel).view(t.sizes()));
  }
  for (auto& unit : units_) compat::release_storage(unit.store);
}

UnitShards::~UnitShards() {
  lm_->unit_hooks.reset();
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
}

void UnitShards::start() {
  std::map<std::string, torch::Tensor> by_name;
  for (auto& p : model_.named_parameters()) by_name[p.key()] = p.value();
  const auto& entries = flat_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto acc = compat::grad_accumulator(by_name.at(entries[i].name));
    const size_t u = unit_of_entry_[i];
    auto key = acc->add_post_hook(std::make_unique<UnitShardsGradHook>([this, u] { grad_accumulated(u); }));
    hooks_.emplace_back(acc, key);
  }
  lm_->unit_hooks = std::make_shared<UnitShardsHooks>(this);
  whole_ = false;
  gathered_ = peak_gathered_ = 0;
}

void UnitShards::issue(size_t u) {
  auto& unit = units_[u];
  if (unit.state != Unit::kReleased) return;
  compat::allocate_storage(unit.store, static_cast<size_t>(unit.numel) * unit.store.element_size());
  torch::NoGradGuard ng;
  auto& packed = flat_.params();
  for (const auto& s : unit.sources) {
    auto dst = unit.store.narrow(0, s.local, s.flat.numel);
    if (s.owner != layout().rank) {
      unit.work.push_back(comm_.broadcast_async(dst, s.owner));
      continue;
    }
    auto mine = packed.narrow(0, flat_.weight_index(s.flat.offset), s.flat.numel);
    dst.copy_(mine);
    unit.work.push_back(comm_.broadcast_async(mine, s.owner));
  }
  unit.state = Unit::kInFlight;
  gathered_ += unit.numel;
  peak_gathered_ = std::max(peak_gathered_, gathered_);
}

void UnitShards::ready(size_t u) {
  issue(u);
  auto& unit = units_[u];
  if (unit.state != Unit::kInFlight) return;
  for (auto& w : unit.work) comm_.wait(w, strf("all-gather of unit %zu's weights (%s)", u, u == blocks_ ? "the rest" : "a block"));
  unit.work.clear();
  unit.state = Unit::kGathered;
  note_held();
}

void UnitShards::release(size_t u, bool force) {
  auto& unit = units_[u];
  if (unit.state == Unit::kReleased && !force) return;
  if (unit.state == Unit::kInFlight)
    for (auto& w : unit.work) comm_.wait(w, strf("all-gather of unit %zu's weights", u));
  unit.work.clear();
  if (unit.state != Unit::kReleased) {
    compat::release_storage(unit.store);
    gathered_ -= unit.numel;
  }
  unit.state = Unit::kReleased;
  unit.pending_grads = 0;
}

void UnitShards::note_held() {
  // What the storages hold now, as the allocator gave it: the packed pieces and every unit's.
  int64_t held = static_cast<int64_t>(flat_.params().storage().nbytes());
  for (const auto& unit : units_) held += static_cast<int64_t>(unit.store.storage().nbytes());
  peak_held_ = std::max(peak_held_, held);
}

void UnitShards::unit_before_forward(size_t u) {
  if (whole_) return;
  ready(u);
  if (u == blocks_) {  // the rest: kept until the backward has its gradients
    if (torch::GradMode::is_enabled()) units_[u].pending_grads = units_[u].params;
    if (blocks_ > 0) issue(0);
  } else if (u + 1 < blocks_) {
    issue(u + 1);
  }
}

void UnitShards::unit_after_forward(size_t u) {
  if (whole_) return;
  release(u);
}

void UnitShards::unit_before_backward(size_t u) {
  if (whole_) return;
  ready(u);
  units_[u].pending_grads = units_[u].params;
  if (u > 0) issue(u - 1);
}

void UnitShards::grad_accumulated(size_t u) {
  if (whole_) return;
  auto& unit = units_[u];
  if (unit.pending_grads > 0 && --unit.pending_grads == 0) release(u);
}

void UnitShards::before_backward(const MicroStep&) {
  // Whatever is still gathered, and the pages other readers mapped since (the EMA reads the whole
  // buffer: the kernel's zero page where released), handed back.
  for (size_t u = 0; u < units_.size(); ++u) release(u, /*force=*/true);
}

void UnitShards::after_backward(int64_t step) {
  for (size_t u = 0; u < units_.size(); ++u) release(u);  // units none of whose gradients came
  if (peak_gathered_ > logged_peak_) {
    logged_peak_ = peak_gathered_;
    log::info(strf("zero-3: at most %lld of %lld weight values gathered at once (%lld bytes of %lld) by step %lld; at "
                   "most %lld bytes held by the weights' storages (its pieces and the gathered units)",
                   (long long)peak_gathered_, (long long)flat_.numel(), (long long)peak_gathered_ * 4,
                   (long long)flat_.numel() * 4, (long long)step, (long long)peak_held_));
  }
}

void UnitShards::replaced() {
  if (whole_) return;  // not started: nothing is released
  for (size_t u = 0; u < units_.size(); ++u) release(u, /*force=*/true);
}

torch::Tensor UnitShards::gather(FlatRange r) {
  auto out = torch::empty({r.numel}, flat_.options());
  const auto& L = layout();
  std::vector<std::shared_ptr<Comm::Pending>> work;
  for (size_t b = 0; b < L.buckets.size(); ++b)
    for (int k = 0; k < L.world; ++k)
      for (const auto& p : L.ranges(b, k)) {
        const int64_t a = std::max(p.offset, r.offset), e = std::min(p.offset + p.numel, r.offset + r.numel);
        if (e <= a) continue;
        auto dst = out.narrow(0, a - r.offset, e - a);
        if (k == L.rank) dst.copy_(flat_.params().narrow(0, flat_.weight_index(a), e - a));
        work.push_back(comm_.broadcast_async(dst, k));
      }
  for (auto& w : work) comm_.wait(w, "gather of a weight tensor (the final weights)");
  return out;
}

std::string UnitShards::describe() const {
  return strf("zero-3: rank %d keeps %lld of %lld weights between steps (packed apart from the units' storages), "
              "%zu units (%zu blocks and the rest) gathered into storages of their own before their forward and "
              "backward and released after; ",
              layout().rank, (long long)layout().owned_numel(), (long long)flat_.numel(), units_.size(), blocks_);
}

}  // namespace lm
