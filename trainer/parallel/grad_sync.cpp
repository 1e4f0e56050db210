// Bucketed gradient all-reduce (see grad_sync.h).
#include "trainer/parallel/grad_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "common/errors.h"
#include "common/log.h"

namespace lm {

namespace {
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(std::function<void()> fn) : fn(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    fn();
    return outputs;
  }
  std::function<void()> fn;
};
}  // namespace

std::vector<FlatRange> plan_buckets(const FlatParams& flat, double bucket_mb) {
  const int64_t elem = static_cast<int64_t>(flat.options().dtype().itemsize());
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1e6 / elem));
  std::vector<FlatRange> buckets;
  for (const auto& e : flat.entries()) {
    if (buckets.empty() || buckets.back().numel + e.numel > cap) buckets.push_back({e.offset, 0});
    buckets.back().numel += e.numel;
  }
  return buckets;
}

GradSync::GradSync(Comm& comm, FlatParams& flat, torch::nn::Module& model, std::vector<FlatRange> buckets, Reduce reduce,
                   std::string what)
    : comm_(comm), flat_(flat), reduce_(std::move(reduce)), what_(std::move(what)) {
  if (!reduce_) reduce_ = [this](size_t, torch::Tensor g) { return std::vector{comm_.all_reduce_async(g)}; };
  const auto& entries = flat.entries();
  for (const auto& b : buckets) buckets_.push_back({b.offset, b.numel, 0, 0, {}});
  for (size_t i = 0, b = 0; i < entries.size(); ++i) {
    while (entries[i].offset >= buckets_[b].offset + buckets_[b].numel) ++b;
    ++buckets_[b].pending_total;
    bucket_of_entry_.push_back(b);
  }
  // One post-hook per parameter on its AccumulateGrad node: it fires once per backward, after the
  // gradient was added into the flat buffer.
  std::map<std::string, torch::Tensor> by_name;
  for (auto& p : model.named_parameters()) by_name[p.key()] = p.value();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto acc = compat::grad_accumulator(by_name.at(entries[i].name));
    auto key = acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { ready(i); }));
    hooks_.emplace_back(acc, key);
  }
}

GradSync::~GradSync() {
  for (auto& [acc, key] : hooks_) acc->del_post_hook(key);
}

void GradSync::begin(bool sync) {
  active_ = sync;
  next_launch_ = 0;
  for (auto& b : buckets_) b.pending = b.pending_total, b.work.clear();
}

void GradSync::ready(size_t entry) {
  if (!active_) return;
  --buckets_[bucket_of_entry_[entry]].pending;
  launch_ready_in_order();
}

void GradSync::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    const size_t i = next_launch_++;
    auto& b = buckets_[i];
    // Gradients in pieces (GradPath::pieces): no flat buffer, the strategy's reduction gathers them.
    b.work = reduce_(i, flat_.path().pieces ? torch::Tensor() : flat_.grads().narrow(0, b.offset, b.numel));
  }
}

void GradSync::finish(int64_t step) {
  if (!reported_) {
    reported_ = true;
    log::info(strf("data parallel: %zu of %zu gradient buckets launched from the backward's hooks at step %lld",
                   next_launch_, buckets_.size(), static_cast<long long>(step)));
  }
  for (auto& b : buckets_) b.pending = 0;  // parameters that got no gradient this step
  launch_ready_in_order();
  for (size_t i = 0; i < buckets_.size(); ++i)
    for (auto& w : buckets_[i].work)
      if (w)
        comm_.wait(w, strf("%s of gradient bucket %zu/%zu at step %lld", what_.c_str(), i + 1, buckets_.size(),
                           static_cast<long long>(step)));
  active_ = false;
}

}  // namespace lm
