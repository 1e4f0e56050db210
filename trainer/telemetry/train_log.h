// The training log's arithmetic: the logging window (log.every_steps steps, one "train" record) and
// the whole run's totals (summary.json). Both survive a resume (state key "metrics").
#pragma once

#include <cstdint>

#include "common/torch/stateful.h"

namespace lm {

class TrainLog : public Stateful {
 public:
  // One optimizer step, over all ranks.
  struct Step {
    double loss = 0;       // global mean loss (non-finite counts as 0 in the window)
    double z_loss = 0;     // global mean z-loss term (optim.z_loss; 0 without), likewise
    double seconds = 0;    // wall time of the step
    double wait_ms = 0;    // the slowest rank's wait for data
    int64_t targets = 0, pad = 0, inputs = 0;
    double flops = 0;      // this rank's matmul FLOPs (models/registry.h flops_per_token)
    bool timed = true;     // counts toward the run's tokens/s (not the first step of a process)
  };
  // The closed window's means.
  struct Window {
    double loss = 0, z_loss = 0, tokens_per_s = 0, step_ms = 0, wait_ms = 0, wait_pct = 0, padding_pct = 0;
    double flops_per_s = 0;  // this rank's matmul FLOPs over the window's summed step time
  };

  void add(const Step& s);
  // Means over the steps added since the last close(); starts a new window.
  Window close();
  double first_loss() const { return first_loss_; }  // first window's mean loss; -1 before any
  double last_loss() const { return last_loss_; }
  double tokens_per_s() const { return timed_s_ > 0 ? timed_tokens_ / timed_s_ : 0; }
  double padding_pct() const { return run_inputs_ > 0 ? 100.0 * run_pad_ / run_inputs_ : 0; }

  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  double z_loss_ = 0;  // window
  double loss_ = 0, time_ = 0, wait_ = 0, tokens_ = 0, pad_ = 0, inputs_ = 0, flops_ = 0;  // window
  int64_t steps_ = 0;
  double first_loss_ = -1, last_loss_ = 0, timed_tokens_ = 0, timed_s_ = 0;  // whole run
  double run_pad_ = 0, run_inputs_ = 0;
};

}  // namespace lm
