// When to save: the checkpoint interval policy. Every N steps (checkpoint.every_steps: N), never
// (0), or "auto" (checkpoint.every_steps: auto), the Young/Daly interval sqrt(2 * MTBF * C) that
// minimises expected lost work plus save cost, where C is what the last save cost the training
// thread (its real stall, trainer/checkpoint/stall.h, reported by the writer, writer.h) and MTBF is
// the job's: checkpoint.mtbf_hours is per node, and a job of n nodes fails n times as often
// (independent failures), so MTBF = mtbf_hours / n.
//
// The policy also keeps what the interval is measured from: the step of the last save started (or
// checkpoint loaded), and the running mean of the loop's step times, which turns the interval in
// steps into time (the time the writer spreads an async save's writes over: Pacing, writer.h).
// Not thread-safe: the training thread alone calls it (save costs are recorded there too).
#pragma once

#include <cstdint>

#include "run/config/checkpoint_config.h"

namespace lm {

class SaveInterval {
 public:
  SaveInterval(const CheckpointConfig& cfg, bool log_changes, int nodes = 1)
      : cfg_(cfg), log_(log_changes), nodes_(nodes < 1 ? 1 : nodes) {}
  // The loop's question: whether a save is due after `step` optimizer steps. step_s: this step's
  // measured seconds, folded into the running mean step time that the auto interval weighs the
  // save's cost against; the last save is last_save_step().
  bool due(int64_t step, double step_s) {
    mean_step_s_ = mean_step_s_ == 0 ? step_s : 0.9 * mean_step_s_ + 0.1 * step_s;
    return due(step, last_save_step_, mean_step_s_);
  }
  // Whether a save is due after `step` optimizer steps, the last save being at `last_save_step`.
  // step_s: measured seconds per step (auto only). Logs the chosen interval when it changes.
  bool due(int64_t step, int64_t last_save_step, double step_s);
  // A save of `step` started, or a checkpoint of `step` was loaded: the interval counts from it.
  void saved(int64_t step) { last_save_step_ = step; }
  // Step of the last save started (or loaded); 0 before any.
  int64_t last_save_step() const { return last_save_step_; }
  // The measured cost (real stall) of the last save in seconds.
  void record_cost(double cost_s) { cost_s_ = cost_s; }
  // The interval chosen by the last due() of an auto policy, in steps (0 before).
  int64_t interval_steps() const { return interval_; }
  // The interval in force, in steps: checkpoint.every_steps, or the auto policy's last choice (0:
  // none known).
  int64_t steps_between_saves() const { return cfg_.every_steps > 0 ? cfg_.every_steps : interval_; }
  // The running mean step time of the loop's due() calls, in seconds (0 before the first).
  double mean_step_s() const { return mean_step_s_; }
  // Bytes of state per save: the cost estimate before any save was measured.
  void set_state_mb(double mb) { state_mb_ = mb; }

 private:
  CheckpointConfig cfg_;
  bool log_;
  int nodes_;
  double cost_s_ = -1;
  double state_mb_ = 0;
  int64_t interval_ = 0;
  int64_t last_save_step_ = 0;
  double mean_step_s_ = 0;  // due()'s running mean
};

}  // namespace lm
