// When to save: every N steps, or "auto" (checkpoint.every_steps: auto), the Young/Daly interval
// sqrt(2 * MTBF * C) that minimises expected lost work plus save cost, where C is what the last
// save cost the training thread (its real stall, trainer/checkpoint/stall.h) and MTBF is the
// job's: checkpoint.mtbf_hours is per node, and a job of n nodes fails n times as often
// (independent failures), so MTBF = mtbf_hours / n. Not thread-safe: the training thread alone
// calls it (save costs are recorded there too).
#pragma once

#include <cstdint>

#include "run/config/checkpoint_config.h"

namespace lm {

class SaveInterval {
 public:
  SaveInterval(const CheckpointConfig& cfg, bool log_changes, int nodes = 1)
      : cfg_(cfg), log_(log_changes), nodes_(nodes < 1 ? 1 : nodes) {}
  // Whether a save is due after `step` optimizer steps, the last save being at `last_save_step`.
  // step_s: measured seconds per step (auto only). Logs the chosen interval when it changes.
  bool due(int64_t step, int64_t last_save_step, double step_s);
  // The measured cost (real stall) of the last save in seconds.
  void record_cost(double cost_s) { cost_s_ = cost_s; }
  // The interval chosen by the last due() of an auto policy, in steps (0 before).
  int64_t interval_steps() const { return interval_; }
  // Bytes of state per save: the cost estimate before any save was measured.
  void set_state_mb(double mb) { state_mb_ = mb; }

 private:
  CheckpointConfig cfg_;
  bool log_;
  int nodes_;
  double cost_s_ = -1;
  double state_mb_ = 0;
  int64_t interval_ = 0;
};

}  // namespace lm
