// One optimizer step's device work (see step.h).
#include "trainer/step/step.h"

#include <cmath>
#include <cstdlib>

#include "common/test_hooks.h"
#include "common/checksum.h"
#include "common/log.h"
#include "common/torch/compat.h"
#include "models/registry.h"

namespace lm {

ForwardBackward::ForwardBackward(Parts p)
    : p_(std::move(p)), uploader_(p_.runtime.device), bf16_(p_.config.train->bf16()),
      fault_nan_step_(test_hooks().nan_step) {}

RankStats ForwardBackward::run(std::vector<data::Batch>& batches, int64_t step, torch::Tensor* stats) {
  const int64_t accum = p_.config.train->grad_accum;
  RankStats mine;
  std::vector<uint64_t> hashes;
  batches_before_ = p_.data.loader->state().batches;
  for (int64_t m = 0; m < accum; ++m) {  // the micro-batches first: their token count normalises the loss
    if (!p_.config.reuse_batch || batches[m].rows == 0) {
      batches[m] = p_.data.loader->next();
      mine.wait_ms += p_.data.loader->last_wait_ms();
      p_.data.source_tokens->add(batches[m]);
    }
    mine.targets += batches[m].target_tokens;
    mine.pad += batches[m].pad_tokens;
    mine.inputs += batches[m].rows * batches[m].cols;
    mine.flops += static_cast<double>(batches[m].rows * batches[m].cols - batches[m].pad_tokens) *
                  flops_per_token(*p_.config.model, p_.runtime.vocab, batches[m].cols);  // real tokens at this length
    hashes.push_back(batches[m].hash);
  }
  mine.hash = accum == 1 ? hashes[0] : xxh64(hashes.data(), hashes.size() * sizeof(uint64_t));
  const double global_targets = global_target_tokens(mine.targets, p_.config.packed, p_.runtime.comm, p_.runtime.world);
  p_.model.flat->zero_grad();
  const auto on_device = torch::TensorOptions().device(p_.runtime.device);
  std::vector<torch::Tensor> losses, z_losses;  // per micro-batch; added up as the parallelism does it
  for (int64_t m = 0; m < accum; ++m) {
    auto& b = batches[m];
    auto x = uploader_.upload(b.inputs, b.rows, b.cols);  // (B, T) int64
    auto y = uploader_.upload(b.targets, b.rows, b.cols);
    const MicroStep micro{step + 1, m, accum};
    p_.model.parallel->before_backward(micro);
    if (bf16_) compat::set_autocast(p_.runtime.device, true);
    // optim.z_loss 0: terms.z undefined and terms.ce is loss_sum(), the one loss back-propagated as before.
    auto terms = b.rows > 0 ? p_.model.lm->loss_terms(x, y) : LossTerms{torch::zeros({}, on_device), {}};
    auto loss = terms.ce;
    if (bf16_) compat::set_autocast(p_.runtime.device, false);
    if (step + 1 == fault_nan_step_) loss = loss * std::nan("");  // fault injection (tests): a non-finite step
    if (b.rows > 0) ((terms.z.defined() ? loss + terms.z : loss) / global_targets).backward();
    if (bf16_) compat::clear_autocast_cache();
    p_.model.parallel->after_micro_backward(micro);
    losses.push_back(loss.detach());
    if (terms.z.defined()) z_losses.push_back(terms.z.detach());
  }
  const torch::Tensor loss_sum = p_.model.parallel->sum_losses(losses);
  torch::Tensor z_sum;  // optim.z_loss only
  if (p_.config.z_loss) z_sum = z_losses.empty() ? torch::zeros({}, on_device) : p_.model.parallel->sum_losses(z_losses);
  p_.model.parallel->after_backward(step + 1);
  const auto norm = p_.model.parallel->grad_norm(step + 1);  // undefined: taken from the flat gradients
  *stats = torch::stack({loss_sum.to(torch::kDouble), clip_grad_norm(*p_.model.flat, p_.config.grad_clip, norm).to(torch::kDouble)});
  if (p_.config.z_loss) *stats = torch::cat({*stats, z_sum.to(torch::kDouble).reshape({1})});
  return mine;
}

StepUpdate::StepUpdate(const AnomalyConfig& anomaly, Optimizer& opt, Ema* ema, int world, Parallelism& parallel)
    : anomaly_(anomaly), opt_(opt), ema_(ema), parallel_(parallel),
      deferred_(opt.gated_on_device() && world == 1 &&
                (anomaly.continues() || (anomaly.skips() && anomaly.spike_factor <= 0))) {
  if (deferred_) log::info("step results read one step late: the device skips non-finite steps, no spike skips");
}

std::unique_ptr<StepResult> StepUpdate::begin(int64_t step, double lr, RankStats mine, const torch::Tensor& stats,
                                              clock::Steady::time_point t0) {
  auto s = std::make_unique<StepResult>();
  s->step = step, s->lr = lr, s->mine = mine, s->t0 = t0;
  if (deferred_) {  // gated on the device: nothing waits for the host
    const auto found_inf = stats.isfinite().all().logical_not().to(torch::kFloat);
    opt_.step(lr, found_inf);
    if (ema_) ema_->update(found_inf);
  }
  s->stats = HostScalars(stats, /*wait=*/!deferred_);  // read at once: the step time includes the device's
  return s;
}

void StepUpdate::update(const std::string& anomaly, double loss, double grad_norm, double lr) {
  if (deferred_) return;
  if (anomaly.empty() || (anomaly_.continues() && std::isfinite(loss) && std::isfinite(grad_norm))) {
    opt_.step(lr);
    parallel_.after_update();  // e.g. every rank's updated pieces, before the EMA reads them
    if (ema_) ema_->update();
  }
}

void StepUpdate::hold(std::unique_ptr<StepResult> s, const std::vector<data::Batch>& batches) {
  s->seconds = clock::seconds_since(s->t0), s->kept = batches;
  pending_ = std::move(s);
}

}  // namespace lm
