// EMA of the weights (see ema.h).
#include "trainer/optim/ema.h"

#include <string>

#include "common/errors.h"
#include "trainer/optim/flat_state.h"

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
  if (part_) {
    st.tensors = flat_slices(flat_, *part_, ema_, "", /*indexed=*/true);
    return st;
  }
  for (const auto& e : flat_.entries()) st.tensors.emplace_back(e.name, ema_.narrow(0, e.offset, e.numel));
  return st;
}

void Ema::load_state(const ComponentState* st) {
  torch::NoGradGuard ng;
  if (!st || (st->tensors.empty() && st->shards.empty())) {
    ema_.copy_(flat_.params());
    return;
  }
  load_flat_values(flat_, ema_, *st, "ema state");
}

}  // namespace lm
