// When to save: every N steps, or "auto" (checkpoint.every_steps: auto), the Young/Daly interval
// sqrt(2 * MTBF * C) that minimises expected lost work plus save cost, where C is what the last
// save cost the training thread (its blocking time) and MTBF is checkpoint.mtbf_hours.
#pragma once

#include <atomic>
#include <cstdint>

#include "trainer/checkpoint/checkpoint_config.h"

namespace lm {

class SaveInterval {
 public:
  SaveInterval(const CheckpointConfig& cfg, bool log_changes) : cfg_(cfg), log_(log_changes) {}
  // Whether a save is due after `step` optimizer steps, the last save being at `last_save_step`.
  // step_s: measured seconds per step (auto only). Logs the chosen interval when it changes.
  bool due(int64_t step, int64_t last_save_step, double step_s);
  // The measured cost of the last save in seconds. Thread-safe (async saves report from a thread).
  void record_cost(double cost_s) { cost_s_.store(cost_s); }
  // Bytes of state per save: the cost estimate before any save was measured.
  void set_state_mb(double mb) { state_mb_ = mb; }

 private:
  CheckpointConfig cfg_;
  bool log_;
  std::atomic<double> cost_s_{-1};
  double state_mb_ = 0;
  int64_t interval_ = 0;
};

}  // namespace lm
