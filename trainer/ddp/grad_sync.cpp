// Bucketed gradient all-reduce (see grad_sync.h).
#include "trainer/ddp/grad_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "common/errors.h"
#include "common/log.h"
#include "trainer/ddp/zero.h"
#include "trainer/optim/adamw.h"

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

GradSync::GradSync(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb, const ZeroShards* zero)
    : comm_(comm), flat_(flat), zero_(zero) {
  const auto& entries = flat.entries();
  for (const auto& b : plan_buckets(flat, bucket_mb)) buckets_.push_back({b.offset, b.numel, 0, 0, nullptr, nullptr});
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
  for (auto& b : buckets_) b.pending = b.pending_total, b.work = nullptr, b.tail = nullptr;
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
    auto grads = flat_.grads().narrow(0, b.offset, b.numel);
    if (!zero_ || !zero_->reduce_scatter()) {
      b.work = comm_.all_reduce_async(grads);
      continue;
    }
    // ZeRO-1: the first world*s values reduce-scattered in place (rank r's sums land on its piece),
    // the fewer than `world` left over all-reduced.
    const auto& layout = zero_->layout();
    const int64_t s = layout.piece_size(i), main = s * layout.world;
    if (s > 0) b.work = comm_.reduce_scatter_async(grads.narrow(0, 0, main), grads.narrow(0, layout.rank * s, s));
    if (main < b.numel) b.tail = comm_.all_reduce_async(grads.narrow(0, main, b.numel - main));
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
  const char* what = zero_ && zero_->reduce_scatter() ? "reduce-scatter" : "all-reduce";
  for (size_t i = 0; i < buckets_.size(); ++i)
    for (auto* w : {&buckets_[i].work, &buckets_[i].tail})
      if (*w)
        comm_.wait(*w, strf("%s of gradient bucket %zu/%zu at step %lld", w == &buckets_[i].tail ? "all-reduce" : what,
                            i + 1, buckets_.size(), static_cast<long long>(step)));
  active_ = false;
}

std::unique_ptr<GradSync> start_data_parallel(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb,
                                              const ZeroShards* zero) {
  comm.broadcast(flat.params(), 0, "broadcast of the initial parameters");
  auto sync = std::make_unique<GradSync>(comm, flat, model, bucket_mb, zero);
  log::info(strf("data parallel: %s, %zu gradient buckets of <= %.0f MB", comm.backend().c_str(), sync->num_buckets(),
                 bucket_mb));
  return sync;
}

}  // namespace lm
