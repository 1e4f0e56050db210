// The training loop: one experiment config in, a trained model, metrics and logs in RUN_DIR out.
//
// Flow of one step: reader -> (B, T+1) token batch -> model forward/backward over grad_accum
// micro-batches -> clip -> AdamW at lr_at(step) -> metrics. Validation every eval.every_steps and
// at the end; final weights in RUN_DIR/model.safetensors.
#pragma once

#include <string>

#include "run/config/config.h"
#include "trainer/telemetry/run_telemetry.h"  // TrainSummary

namespace lm {


// Runs `cfg` (validated by load_config). `command` is recorded in the run directory.
TrainSummary train(const ExperimentConfig& cfg, const std::string& command);

}  // namespace lm
