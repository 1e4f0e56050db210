// An exponential moving average of the weights (train.ema_decay), kept as one flat tensor beside
// FlatParams and evaluated by swapping it in.
#pragma once

#include <torch/torch.h>

#include <optional>
#include <vector>

#include "common/torch/stateful.h"
#include "trainer/optim/adamw.h"

namespace lm {

class Ema : public Stateful {
 public:
  // Starts as a copy of the current weights. REQUIRES: 0 < decay < 1. part: the ranges this rank
  // keeps the average of (the parallelism's weights_part(): ZeRO-3 keeps its pieces of the weights
  // only), the only values it updates, saves (its own part of a sharded checkpoint component) and
  // loads; the rest of values() is never written here (its pages never touched); unset: all.
  Ema(FlatParams& flat, double decay, std::optional<std::vector<FlatRange>> part = std::nullopt);
  // ema += (1 - decay) * (params - ema), after each optimizer step. found_inf (optional, 0-dim float
  // on the device, as AdamW::step takes it): where it holds 1 the EMA stays as it was, decided on
  // the device (the fused path's skipped step).
  void update(const torch::Tensor& found_inf = {});
  // Asked before the EMA or (swapping) the parameters are written (nullptr: none).
  void set_fence(WriteFence* f) { fence_ = f; }
  // The average, laid out as flat.params() (updated in place, never replaced).
  const torch::Tensor& values() const { return ema_; }
  // Runs fn() with the EMA weights in place of the model's, then puts the model's back: the ranges
  // of its part (the pieces a rank keeps of weights it keeps in parts, ZeRO-3: the others are
  // gathered from their owners inside fn), or all of them.
  template <typename F>
  auto with_weights(F&& fn) {
    if (fence_) fence_->before_write();
    torch::NoGradGuard ng;
    const std::vector<FlatRange> ranges = this->ranges();
    std::vector<torch::Tensor> saved;
    for (const auto& r : ranges) {
      saved.push_back(at(flat_.params(), r).clone());
      at(flat_.params(), r).copy_(at(ema_, r));
    }
    struct Restore {
      const Ema& self;
      const std::vector<FlatRange>& ranges;
      std::vector<torch::Tensor>& saved;
      ~Restore() {
        for (size_t i = 0; i < ranges.size(); ++i) self.at(self.flat_.params(), ranges[i]).copy_(saved[i]);
      }
    } restore{*this, ranges, saved};
    return fn();
  }
  const std::optional<std::vector<FlatRange>>& part() const { return part_; }
  // State under "ema": tensors by parameter name (views), or with a part its slices
  // ("<param>[a:b]", flat_state.h). Loads whole or sliced tensors and a sharded checkpoint's parts.
  // A checkpoint without EMA state (EMA was off) restarts the average from the current weights:
  // load_state(nullptr).
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  FlatParams& flat_;
  double decay_;
  WriteFence* fence_ = nullptr;
  // Range r of the flat values in `t`, laid out as the weights (flat.weight_index).
  torch::Tensor at(const torch::Tensor& t, FlatRange r) const { return t.narrow(0, flat_.weight_index(r.offset), r.numel); }
  // The ranges this average keeps: its part, or all of it.
  std::vector<FlatRange> ranges() const { return part_ ? *part_ : std::vector<FlatRange>{{0, flat_.numel()}}; }
  torch::Tensor ema_;  // (numel,) like flat_.params()
  std::optional<std::vector<FlatRange>> part_;
};

}  // namespace lm
