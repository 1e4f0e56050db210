// ZeRO-3: units gathered before use and released after, weights kept as pieces (see zero3.h).
#include "trainer/parallel/zero3.h"

#include <sys/mman.h>
#include <unistd.h>

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <algorithm>
#include <map>
#include <set>

#include "common/errors.h"
#include "common/log.h"
#include "common/test_hooks.h"

namespace lm {
namespace {

struct Zero3UnitHooks : UnitHooks {
  explicit Zero3UnitHooks(Zero3* z) : z(z) {}
  void before_forward(size_t u) override { z->unit_before_forward(u); }
  void after_forward(size_t u) override { z->unit_after_forward(u); }
  void before_backward(size_t u) override { z->unit_before_backward(u); }
  Zero3* z;
};

struct Zero3GradHook : torch::autograd::FunctionPostHook {
  explicit Zero3GradHook(std::function<void()> fn) : fn(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn();
    return outputs;
  }
  std::function<void()> fn;
};

void zero3_add_range(std::vector<FlatRange>& out, int64_t offset, int64_t numel) {
  if (numel <= 0) return;
  if (!out.empty() && out.back().offset + out.back().numel == offset) out.back().numel += numel;
  else out.push_back({offset, numel});
}

}  // namespace

Zero3::Zero3(const ParallelInit& init)
    : Zero2(init), lm_(dynamic_cast<LMImpl*>(&init.model)), measure_resident_(test_hooks().measure_weights_resident) {
  if (!lm_) throw ConfigError("key 'dist.zero': 3 shards the weights of a language model's units (blocks and the rest); this module is none");
  if (!flat_.params().is_cpu())
    throw ConfigError("key 'dist.zero': 3 runs on the CPU only for now (its released weights' pages are handed back "
                      "with madvise; on CUDA that needs the allocator's virtual memory): use dist.zero=1 there");
  // The units: each block's parameters, then the rest.
  std::map<const void*, size_t> unit_of_param;
  auto blocks = lm_->block_list();
  blocks_ = blocks->size();
  for (size_t i = 0; i < blocks_; ++i)
    for (auto& p : blocks->ptr(i)->parameters()) unit_of_param[p.unsafeGetTensorImpl()] = i;
  units_.resize(blocks_ + 1);
  std::map<std::string, torch::Tensor> by_name;
  for (auto& p : model_.named_parameters()) by_name[p.key()] = p.value();
  for (const auto& e : flat_.entries()) {
    auto it = unit_of_param.find(by_name.at(e.name).unsafeGetTensorImpl());
    const size_t u = it == unit_of_param.end() ? blocks_ : it->second;
    unit_of_entry_.push_back(u);
    zero3_add_range(units_[u].ranges, e.offset, e.numel);
    units_[u].numel += e.numel;
    ++units_[u].params;
  }
  // What each owner broadcasts into each unit: the unit's ranges cut by the bucket pieces, in flat
  // order (the same list on every rank, so the collectives pair up).
  const auto& L = layout();
  for (auto& unit : units_)
    for (const auto& r : unit.ranges)
      for (size_t b = 0; b < L.buckets.size(); ++b)
        for (int k = 0; k < L.world; ++k)
          for (const auto& p : L.ranges(b, k)) {
            const int64_t a = std::max(p.offset, r.offset), e = std::min(p.offset + p.numel, r.offset + r.numel);
            if (e > a) unit.sources.push_back({{a, e - a}, k});
          }
  // The flat buffer moved into our own mapping (no huge pages: released in 4 KiB pages), every
  // parameter a view of it as before; the old buffer is freed with its last view.
  page_ = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const int64_t n = flat_.numel();
  const size_t bytes = std::max<size_t>(page_, (static_cast<size_t>(n) * sizeof(float) + page_ - 1) / page_ * page_);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mem == MAP_FAILED) throw Error(strf("zero-3: mmap of %zu bytes for the weights failed", bytes));
  ::madvise(mem, bytes, MADV_NOHUGEPAGE);
  base_ = static_cast<char*>(mem);
  auto buffer = torch::from_blob(mem, {n}, [bytes](void* p) { ::munmap(p, bytes); }, flat_.params().options());
  {
    torch::NoGradGuard ng;
    // Values written already (a module built whole) move with the buffer; a deferred build's are
    // written after, each rank its pieces only (FlatParams::write): no page of the others' is touched.
    if (!flat_.values_pending()) buffer.copy_(flat_.params());
    for (const auto& e : flat_.entries()) {
      auto& t = by_name.at(e.name);
      t.set_data(buffer.narrow(0, e.offset, e.numel).view(t.sizes()));
    }
  }
  flat_.params() = buffer;
  // The pages of each unit this rank may release: whole pages of its ranges holding no owned value.
  const auto owned = layout().owned();
  for (auto& unit : units_)
    for (const auto& r : unit.ranges) {
      std::vector<FlatRange> free;  // r minus the owned ranges
      int64_t at = r.offset;
      const int64_t end = r.offset + r.numel;
      for (const auto& o : owned) {
        if (o.offset + o.numel <= at || o.offset >= end) continue;
        zero3_add_range(free, at, o.offset - at);
        at = std::max(at, o.offset + o.numel);
      }
      zero3_add_range(free, at, end - at);
      for (const auto& f : free) {
        const size_t a = (static_cast<size_t>(f.offset) * sizeof(float) + page_ - 1) / page_ * page_;
        const size_t e = static_cast<size_t>(f.offset + f.numel) * sizeof(float) / page_ * page_;
        if (e > a) unit.spans.push_back({a, e - a});
      }
    }
}

Zero3::~Zero3() {
  lm_->unit_hooks.reset();
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
}

void Zero3::start() {
  Zero2::start();  // rank 0's weights to every rank, the gradient buckets' hooks
  std::map<std::string, torch::Tensor> by_name;
  for (auto& p : model_.named_parameters()) by_name[p.key()] = p.value();
  const auto& entries = flat_.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto acc = compat::grad_accumulator(by_name.at(entries[i].name));
    const size_t u = unit_of_entry_[i];
    auto key = acc->add_post_hook(std::make_unique<Zero3GradHook>([this, u] { grad_accumulated(u); }));
    hooks_.emplace_back(acc, key);
  }
  lm_->unit_hooks = std::make_shared<Zero3UnitHooks>(this);
  whole_ = false;
  for (size_t u = 0; u < units_.size(); ++u) units_[u].state = Unit::kGathered, gathered_ += units_[u].numel;
  for (size_t u = 0; u < units_.size(); ++u) release(u);
  gathered_ = peak_gathered_ = 0;
}

void Zero3::issue(size_t u) {
  auto& unit = units_[u];
  if (unit.state != Unit::kReleased) return;
  auto& p = flat_.params();
  for (const auto& [r, owner] : unit.sources)
    unit.work.push_back(comm_.broadcast_async(p.narrow(0, r.offset, r.numel), owner));
  unit.state = Unit::kInFlight;
  gathered_ += unit.numel;
  peak_gathered_ = std::max(peak_gathered_, gathered_);
}

void Zero3::ready(size_t u) {
  issue(u);
  auto& unit = units_[u];
  if (unit.state != Unit::kInFlight) return;
  for (auto& w : unit.work) comm_.wait(w, strf("all-gather of unit %zu's weights (%s)", u, u == blocks_ ? "the rest" : "a block"));
  unit.work.clear();
  unit.state = Unit::kGathered;
  if (measure_resident_) note_peak();
}

void Zero3::release(size_t u, bool force) {
  auto& unit = units_[u];
  if (unit.state == Unit::kReleased && !force) return;
  if (unit.state == Unit::kInFlight)
    for (auto& w : unit.work) comm_.wait(w, strf("all-gather of unit %zu's weights", u));
  unit.work.clear();
  for (const auto& [a, len] : unit.spans) ::madvise(base_ + a, len, MADV_DONTNEED);
  if (unit.state != Unit::kReleased) gathered_ -= unit.numel;
  unit.state = Unit::kReleased;
  unit.pending_grads = 0;
}

void Zero3::note_peak() {
  // The pages of the weights' mapping the kernel holds now (test hook: LM_TEST_WEIGHTS_RESIDENT=1).
  const size_t bytes = (static_cast<size_t>(flat_.numel()) * sizeof(float) + page_ - 1) / page_ * page_;
  std::vector<unsigned char> vec(bytes / page_);
  if (::mincore(base_, bytes, vec.data()) != 0) return;
  int64_t resident = 0;
  for (auto v : vec) resident += (v & 1) ? static_cast<int64_t>(page_) : 0;
  peak_resident_ = std::max(peak_resident_, resident);
}

void Zero3::unit_before_forward(size_t u) {
  if (whole_) return;
  ready(u);
  if (u == blocks_) {  // the rest: kept until the backward has its gradients
    if (torch::GradMode::is_enabled()) units_[u].pending_grads = units_[u].params;
    if (blocks_ > 0) issue(0);
  } else if (u + 1 < blocks_) {
    issue(u + 1);
  }
}

void Zero3::unit_after_forward(size_t u) {
  if (whole_) return;
  release(u);
}

void Zero3::unit_before_backward(size_t u) {
  if (whole_) return;
  ready(u);
  units_[u].pending_grads = units_[u].params;
  if (u > 0) issue(u - 1);
}

void Zero3::grad_accumulated(size_t u) {
  if (whole_) return;
  auto& unit = units_[u];
  if (unit.pending_grads > 0 && --unit.pending_grads == 0) release(u);
}

void Zero3::before_backward(const MicroStep& m) {
  Zero2::before_backward(m);
  // Whatever is still gathered, and the pages other readers mapped since (the EMA reads the whole
  // buffer: the kernel's zero page where released), handed back.
  for (size_t u = 0; u < units_.size(); ++u) release(u, /*force=*/true);
}

void Zero3::after_backward(int64_t step) {
  Zero2::after_backward(step);
  for (size_t u = 0; u < units_.size(); ++u) release(u);  // units none of whose gradients came
  if (peak_gathered_ > logged_peak_) {
    logged_peak_ = peak_gathered_;
    std::string resident = measure_resident_ ? strf("; at most %lld bytes of the weights' pages resident (mincore)",
                                                    (long long)peak_resident_)
                                             : "";
    log::info(strf("zero-3: at most %lld of %lld weight values gathered at once (%lld bytes of %lld) by step %lld%s",
                   (long long)peak_gathered_, (long long)flat_.numel(), (long long)peak_gathered_ * 4,
                   (long long)flat_.numel() * 4, (long long)step, resident.c_str()));
  }
}

void Zero3::weights_replaced() {
  if (whole_) return;  // not started: nothing is released
  for (size_t u = 0; u < units_.size(); ++u) release(u, /*force=*/true);
}

torch::Tensor Zero3::gather_weights(FlatRange r) {
  auto out = torch::empty({r.numel}, flat_.params().options());
  const auto& L = layout();
  std::vector<std::shared_ptr<Comm::Pending>> work;
  for (size_t b = 0; b < L.buckets.size(); ++b)
    for (int k = 0; k < L.world; ++k)
      for (const auto& p : L.ranges(b, k)) {
        const int64_t a = std::max(p.offset, r.offset), e = std::min(p.offset + p.numel, r.offset + r.numel);
        if (e <= a) continue;
        auto dst = out.narrow(0, a - r.offset, e - a);
        if (k == L.rank) dst.copy_(flat_.params().narrow(0, a, e - a));
        work.push_back(comm_.broadcast_async(dst, k));
      }
  for (auto& w : work) comm_.wait(w, "gather of a weight tensor (the final weights)");
  return out;
}

std::string Zero3::describe(int64_t optimizer_bytes, const std::string& what) const {
  int64_t releasable = 0;
  for (const auto& unit : units_)
    for (const auto& s : unit.spans) releasable += static_cast<int64_t>(s.second);
  return strf("zero-3: rank %d keeps %lld of %lld weights between steps (%lld bytes of pages it never releases), "
              "%zu units (%zu blocks and the rest) gathered before their forward and backward and released after; ",
              layout().rank, (long long)layout().owned_numel(), (long long)flat_.numel(),
              (long long)(flat_.numel() * 4 - releasable), units_.size(), blocks_) +
         Zero2::describe(optimizer_bytes, what);
}

}  // namespace lm
