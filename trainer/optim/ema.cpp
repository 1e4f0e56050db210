// EMA of the weights (see ema.h).
#include "trainer/optim/ema.h"

#include <map>
#include <string>

#include "common/errors.h"

namespace lm {

Ema::Ema(FlatParams& flat, double decay) : flat_(flat), decay_(decay), ema_(flat.params().clone()) {}

void Ema::update(const torch::Tensor& found_inf) {
  if (fence_) fence_->before_write();
  if (!found_inf.defined()) {
    ema_.lerp_(flat_.params(), 1.0 - decay_);
    return;
  }
  ema_.lerp_(flat_.params(), (1.0 - found_inf) * (1.0 - decay_));  // weight 0 where the step was skipped
}

ComponentState Ema::state() const {
  ComponentState st;
  for (const auto& e : flat_.entries()) st.tensors.emplace_back(e.name, ema_.narrow(0, e.offset, e.numel));
  return st;
}

void Ema::load_state(const ComponentState* st) {
  torch::NoGradGuard ng;
  if (!st || st->tensors.empty()) {
    ema_.copy_(flat_.params());
    return;
  }
  std::map<std::string, torch::Tensor> by_name(st->tensors.begin(), st->tensors.end());
  for (const auto& e : flat_.entries()) {
    auto it = by_name.find(e.name);
    if (it == by_name.end() || it->second.numel() != e.numel)
      throw CheckpointError("ema state: missing or mis-shaped tensor '" + e.name + "'");
    ema_.narrow(0, e.offset, e.numel).copy_(it->second.reshape({-1}));
  }
}

}  // namespace lm
