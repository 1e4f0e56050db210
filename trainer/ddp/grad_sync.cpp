// Bucketed gradient all-reduce (see grad_sync.h).
#include "trainer/ddp/grad_sync.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "common/errors.h"
#include "common/log.h"
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

GradSync::GradSync(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb)
    : comm_(comm), flat_(flat) {
  const int64_t cap = std::max<int64_t>(1, static_cast<int64_t>(bucket_mb * 1e6 / flat.grads().element_size()));
  const auto& entries = flat.entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    if (buckets_.empty() || buckets_.back().numel + entries[i].numel > cap)
      buckets_.push_back({entries[i].offset, 0, 0, 0, nullptr});
    buckets_.back().numel += entries[i].numel;
    ++buckets_.back().pending_total;
    bucket_of_entry_.push_back(buckets_.size() - 1);
  }
  // One post-hook per parameter on its AccumulateGrad node: it fires once per backward, after the
  // gradient was added into the flat buffer.
  std::map<std::string, torch::Tensor> by_name;
  for (auto& p : model.named_parameters()) by_name[p.key()] = p.value();
  for (size_t i = 0; i < entries.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(by_name.at(entries[i].name));
    auto key = acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { ready(i); }));
    hooks_.emplace_back(acc, key);
  }
}

GradSync::~GradSync() {
  for (auto& [acc, key] : hooks_) static_cast<torch::autograd::Node*>(acc.get())->del_post_hook(key);
}

void GradSync::begin(bool sync) {
  active_ = sync;
  next_launch_ = 0;
  for (auto& b : buckets_) b.pending = b.pending_total, b.work = nullptr;
}

void GradSync::ready(size_t entry) {
  if (!active_) return;
  --buckets_[bucket_of_entry_[entry]].pending;
  launch_ready_in_order();
}

void GradSync::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    auto& b = buckets_[next_launch_++];
    b.work = comm_.all_reduce_async(flat_.grads().narrow(0, b.offset, b.numel));
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
    comm_.wait(buckets_[i].work, strf("all-reduce of gradient bucket %zu/%zu at step %lld", i + 1,
                                      buckets_.size(), static_cast<long long>(step)));
  active_ = false;
}

std::unique_ptr<GradSync> start_data_parallel(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb) {
  comm.broadcast(flat.params(), 0, "broadcast of the initial parameters");
  auto sync = std::make_unique<GradSync>(comm, flat, model, bucket_mb);
  log::info(strf("data parallel: %s, %zu gradient buckets of <= %.0f MB", comm.backend().c_str(), sync->num_buckets(),
                 bucket_mb));
  return sync;
}

}  // namespace lm
