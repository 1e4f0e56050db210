// The learning-rate schedule (see schedule.h).
#include "trainer/optim/schedule.h"

#include <cmath>

#include "common/log.h"

namespace lm {

double lr_at(const ScheduleConfig& s, double peak_lr, int64_t max_steps, int64_t step) {
  if (step < s.warmup_steps) return peak_lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.kind == "constant") return peak_lr;
  const int64_t end = s.decay_steps > 0 ? s.decay_steps : max_steps;
  const double min_lr = peak_lr * s.min_lr_ratio;
  if (step >= end || end <= s.warmup_steps) return min_lr;
  double frac = static_cast<double>(step - s.warmup_steps) / static_cast<double>(end - s.warmup_steps);
  double k = s.kind == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * frac)) : 1.0 - frac;
  return min_lr + (peak_lr - min_lr) * k;
}

ComponentState LrSchedule::state() const {
  const int64_t step = *step_;
  ComponentState st;
  st.values = {{"kind", cfg_.kind}, {"step", step}, {"lr", at(step)}};
  return st;
}

void LrSchedule::load_state(const ComponentState* st) {
  const std::string was = st->values.value("kind", "");
  if (was != cfg_.kind) log::warn("schedule.kind changed at resume: " + was + " -> " + cfg_.kind);
}

}  // namespace lm
