// The learning-rate schedule: linear warmup, then cosine / linear decay or constant.
#pragma once

#include <cstdint>

#include "trainer/stateful.h"
#include "trainer/optim/optim_config.h"

namespace lm {

// Learning rate at optimizer step `step` (0-based): linear warmup over warmup_steps to optim.lr,
// then cosine / linear decay to lr*min_lr_ratio at decay_steps (default max_steps), or constant.
double lr_at(const ScheduleConfig& s, double peak_lr, int64_t max_steps, int64_t step);

// The schedule of one run. It is a pure function of the step; its state ("scheduler") records
// kind, step and lr for inspection, and a resume under another kind is logged.
class LrSchedule : public Stateful {
 public:
  // `step`: the run's optimizer steps done (its state records them), outliving the schedule.
  LrSchedule(const ScheduleConfig& s, double peak_lr, int64_t max_steps, const int64_t* step)
      : cfg_(s), peak_lr_(peak_lr), max_steps_(max_steps), step_(step) {}
  double at(int64_t step) const { return lr_at(cfg_, peak_lr_, max_steps_, step); }
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  ScheduleConfig cfg_;
  double peak_lr_;
  int64_t max_steps_;
  const int64_t* step_;
};

}  // namespace lm
