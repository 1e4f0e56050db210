// Configuration of the run (`run:`), the training loop (`train:`), logging (`log:`) and
// validation (`eval:`).
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct RunConfig {
  std::string dir = "runs/default";  // run directory (config, metrics, logs, checkpoints)
  int64_t seed = 1337;               // seeds model init, dropout and data order
};

struct TrainConfig {
  int64_t max_steps = 1000;       // optimizer steps
  int64_t micro_batch_size = 8;   // sequences per forward/backward
  int64_t grad_accum = 1;         // micro-batches per optimizer step
  int64_t threads = 0;            // LibTorch intra-op threads; 0 = LibTorch's default
  std::string device = "auto";    // auto | cpu | cuda
  double ema_decay = 0.0;         // EMA of the weights, updated every step; 0 = off
};

struct LogConfig {
  int64_t every_steps = 10;  // console line and metrics.jsonl record every N steps
};

struct EvalConfig {
  int64_t every_steps = 0;  // validation loss every N steps (and at the end); 0 = only at the end
  int64_t batches = 20;     // validation micro-batches per evaluation; 0 = no validation
};

}  // namespace lm
