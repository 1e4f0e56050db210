// The training loop: one experiment config in, a trained model, metrics and logs in RUN_DIR out.
//
// Flow of one step: reader -> (B, T+1) token batch -> model forward/backward over grad_accum
// micro-batches -> clip -> AdamW at lr_at(step) -> metrics. Validation every eval.every_steps and
// at the end; final weights in RUN_DIR/model.safetensors.
#pragma once

#include <string>

#include "trainer/config.h"

namespace lm {

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0;  // mean loss of the first / last logging window
  double val_loss = -1;                  // last validation loss; -1 when none ran
  double tokens_per_s = 0;               // over all steps after the first
  double wall_s = 0;
};

// Runs `cfg` (validated by load_config). `command` is recorded in the run directory.
TrainSummary train(const ExperimentConfig& cfg, const std::string& command);

}  // namespace lm
