// EMA of the weights (see ema.h).
#include "trainer/optim/ema.h"

#include <string>

#include "common/errors.h"
#include "trainer/optim/flat_state.h"

namespace lm {

Ema::Ema(FlatParams& flat, double decay, std::optional<std::vector<FlatRange>> part)
    : flat_(flat), decay_(decay), part_(std::move(part)) {
  torch::NoGradGuard ng;
  if (!part_) {
    ema_ = flat.params().clone();
    return;
  }
  // Laid out as the weights: with weights in pieces packed as they are, else the whole buffer's
  // layout (the pages outside the part never touched).
  ema_ = torch::empty_like(flat.params());
  for (const auto& r : ranges()) at(ema_, r).copy_(at(flat.params(), r));
}

void Ema::update(const torch::Tensor& found_inf) {
  if (fence_) fence_->before_write();
  torch::NoGradGuard ng;
  if (ema_.is_cpu() && ema_.scalar_type() == torch::kFloat) {
    // Value by value, the same arithmetic wherever a value sits (ATen's lerp takes another path in
    // its vector body than in its tail, so a range's cut would change the bits): lerp's formula.
    if (found_inf.defined() && found_inf.item<float>() != 0) return;  // the step was skipped
    const float w = static_cast<float>(1.0 - decay_);
    float* e = ema_.data_ptr<float>();
    const float* p = flat_.params().data_ptr<float>();
    for (const auto& r : ranges()) {
      const int64_t first = flat_.weight_index(r.offset);
      at::parallel_for(first, first + r.numel, 1 << 16, [&](int64_t a, int64_t b) {
        for (int64_t i = a; i < b; ++i) e[i] = w < 0.5f ? e[i] + w * (p[i] - e[i]) : p[i] - (p[i] - e[i]) * (1.0f - w);
      });
    }
    return;
  }
  for (const auto& r : ranges()) {
    auto e = at(ema_, r);
    const auto p = at(flat_.params(), r);
    if (!found_inf.defined()) e.lerp_(p, 1.0 - decay_);
    else e.lerp_(p, (1.0 - found_inf) * (1.0 - decay_));  // weight 0 where the step was skipped
  }
}

ComponentState Ema::state() const {
  ComponentState st;
  if (part_) {
    st.tensors = flat_slices(flat_, *part_, ema_, "", /*indexed=*/!flat_.weights_packed());
    return st;
  }
  for (const auto& e : flat_.entries()) st.tensors.emplace_back(e.name, ema_.narrow(0, e.offset, e.numel));
  return st;
}

void Ema::load_state(const ComponentState* st) {
  torch::NoGradGuard ng;
  if (!st || (st->tensors.empty() && st->shards.empty())) {
    for (const auto& r : ranges()) at(ema_, r).copy_(at(flat_.params(), r));
    return;
  }
  load_flat_values(flat_, ema_, *st, "ema state", part_ ? &*part_ : nullptr, /*packed=*/flat_.weights_packed());
}

}  // namespace lm
