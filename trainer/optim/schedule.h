// The learning-rate schedule: linear warmup, then cosine / linear decay, constant, or wsd (warmup,
// stable, decay).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>

#include "common/torch/stateful.h"
#include "run/config/optim_config.h"

namespace lm {

// Learning rate at optimizer step `step` (0-based): linear warmup over warmup_steps to optim.lr,
// then cosine / linear decay to lr*min_lr_ratio at decay_steps (default max_steps), or constant;
// wsd: optim.lr until the decay window (wsd_decay_window, optim_config.h), from optim.lr at its
// first step down its shape (decay_shape, progress p = (step - start) / (end - start): linear 1 - p,
// 1-sqrt 1 - sqrt(p), cosine (1 + cos(pi p)) / 2) to the floor lr*min_lr_ratio at its end and after.
double lr_at(const ScheduleConfig& s, double peak_lr, int64_t max_steps, int64_t step);

// The schedule of one run. It is a pure function of the step; its state ("scheduler") records
// kind, step and lr for inspection (wsd: and the decay window), and a resume under another kind is
// logged. wsd: a resume whose decay window moved (a later train.max_steps, another decay length or
// anneal stage: continual pretraining) is allowed when every step done ran before both decays
// (the same lr under either), logged and recorded (record()); otherwise refused (ConfigError):
// the lr would jump.
class LrSchedule : public Stateful {
 public:
  // `step`: the run's optimizer steps done (its state records them), outliving the schedule.
  LrSchedule(const ScheduleConfig& s, double peak_lr, int64_t max_steps, const int64_t* step)
      : cfg_(s), peak_lr_(peak_lr), max_steps_(max_steps), step_(step) {}
  double at(int64_t step) const { return lr_at(cfg_, peak_lr_, max_steps_, step); }
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;
  // meta.json's "schedule": kind, warmup_steps, min_lr_ratio, and the decay's first step and end
  // (decay_start, decay_end; constant: none); wsd: decay_shape, and after a resume that moved the
  // decay "decay_moved": {resumed_at_step, was_decay_start, was_decay_end}.
  nlohmann::json record() const;

 private:
  ScheduleConfig cfg_;
  double peak_lr_;
  int64_t max_steps_;
  const int64_t* step_;
  nlohmann::json moved_;  // null, or how a resume moved wsd's decay
};

}  // namespace lm
