// An exponential moving average of the weights (train.ema_decay), kept as one flat tensor beside
// FlatParams and evaluated by swapping it in.
#pragma once

#include <torch/torch.h>

#include "common/torch/stateful.h"
#include "trainer/optim/adamw.h"

namespace lm {

class Ema : public Stateful {
 public:
  // Starts as a copy of the current weights. REQUIRES: 0 < decay < 1.
  Ema(FlatParams& flat, double decay);
  // ema += (1 - decay) * (params - ema), after each optimizer step. found_inf (optional, 0-dim float
  // on the device, as AdamW::step takes it): where it holds 1 the EMA stays as it was, decided on
  // the device (the fused path's skipped step).
  void update(const torch::Tensor& found_inf = {});
  // Asked before the EMA or (swapping) the parameters are written (nullptr: none).
  void set_fence(WriteFence* f) { fence_ = f; }
  // The average, (numel,) laid out as flat.params() (updated in place, never replaced).
  const torch::Tensor& values() const { return ema_; }
  // Runs fn() with the EMA weights in place of the model's, then puts the model's back.
  template <typename F>
  auto with_weights(F&& fn) {
    if (fence_) fence_->before_write();
    torch::NoGradGuard ng;
    auto saved = flat_.params().clone();
    flat_.params().copy_(ema_);
    struct Restore {
      torch::Tensor& p;
      torch::Tensor& saved;
      ~Restore() { p.copy_(saved); }
    } restore{flat_.params(), saved};
    return fn();
  }
  // State under "ema": tensors by parameter name (views). A checkpoint without EMA state (EMA was
  // off) restarts the average from the current weights: load_state(nullptr).
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  FlatParams& flat_;
  double decay_;
  WriteFence* fence_ = nullptr;
  torch::Tensor ema_;  // (numel,) like flat_.params()
};

}  // namespace lm
