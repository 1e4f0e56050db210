// The learning-rate schedule (see schedule.h).
#include "trainer/optim/schedule.h"

#include <algorithm>
#include <cmath>

#include "common/errors.h"
#include "common/log.h"

namespace lm {
namespace {

double wsd_lr(const ScheduleConfig& s, double peak_lr, int64_t max_steps, int64_t step) {
  const DecayWindow d = wsd_decay_window(s, max_steps);
  const double min_lr = peak_lr * s.min_lr_ratio;
  if (step < d.start) return peak_lr;
  if (step >= d.end) return min_lr;
  const double p = static_cast<double>(step - d.start) / static_cast<double>(d.end - d.start);
  const double k = s.decay_shape == "1-sqrt" ? 1.0 - std::sqrt(p)
                   : s.decay_shape == "cosine" ? 0.5 * (1.0 + std::cos(M_PI * p))
                                               : 1.0 - p;
  return min_lr + (peak_lr - min_lr) * k;
}

}  // namespace

double lr_at(const ScheduleConfig& s, double peak_lr, int64_t max_steps, int64_t step) {
  if (step < s.warmup_steps) return peak_lr * static_cast<double>(step + 1) / s.warmup_steps;
  if (s.kind == "constant") return peak_lr;
  if (s.wsd()) return wsd_lr(s, peak_lr, max_steps, step);
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
  if (cfg_.wsd()) {
    const DecayWindow d = wsd_decay_window(cfg_, max_steps_);
    st.values["decay_start"] = d.start, st.values["decay_end"] = d.end;
  }
  return st;
}

void LrSchedule::load_state(const ComponentState* st) {
  const std::string was = st->values.value("kind", "");
  if (was != cfg_.kind) log::warn("schedule.kind changed at resume: " + was + " -> " + cfg_.kind);
  if (was != "wsd" || !cfg_.wsd()) return;
  const DecayWindow now = wsd_decay_window(cfg_, max_steps_);
  const DecayWindow then{st->values.value("decay_start", now.start), st->values.value("decay_end", now.end)};
  if (then.start == now.start && then.end == now.end) return;
  const int64_t done = st->values.value("step", int64_t{0});
  const std::string moved = strf("wsd's decay moved at resume from step %lld: steps %lld-%lld -> %lld-%lld",
                                 (long long)done, (long long)then.start, (long long)then.end, (long long)now.start,
                                 (long long)now.end);
  if (done > std::min(then.start, now.start)) {
    ScheduleConfig old = cfg_;  // the lr the checkpoint's next step had, for the message
    old.anneal_start = then.start, old.decay_steps = then.end - then.start, old.decay_fraction = 0;
    throw ConfigError(strf("schedule: %s, but step %lld is past the start of %s decay: the lr would jump from %.4g to "
                           "%.4g. Resume from a checkpoint at or before step %lld (checkpoint.resume), or keep the "
                           "decay (train.max_steps, schedule.decay_steps / decay_fraction, the anneal stage)",
                           moved.c_str(), (long long)done, done > then.start ? "the old" : "the new",
                           lr_at(old, peak_lr_, max_steps_, done), at(done),
                           (long long)std::min(then.start, now.start)));
  }
  log::info("schedule: " + moved + " (every step done ran before both decays, at the same lr)");
  moved_ = {{"resumed_at_step", done}, {"was_decay_start", then.start}, {"was_decay_end", then.end}};
}

nlohmann::json LrSchedule::record() const {
  nlohmann::json r = {{"kind", cfg_.kind}, {"warmup_steps", cfg_.warmup_steps}, {"min_lr_ratio", cfg_.min_lr_ratio}};
  if (cfg_.wsd()) {
    const DecayWindow d = wsd_decay_window(cfg_, max_steps_);
    r["decay_start"] = d.start, r["decay_end"] = d.end, r["decay_shape"] = cfg_.decay_shape;
    if (!moved_.is_null()) r["decay_moved"] = moved_;
  } else if (cfg_.kind != "constant") {
    r["decay_start"] = cfg_.warmup_steps, r["decay_end"] = cfg_.decay_steps > 0 ? cfg_.decay_steps : max_steps_;
  }
  return r;
}

}  // namespace lm
