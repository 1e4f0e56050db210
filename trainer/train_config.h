// Configuration of the run (`run:`), the training loop (`train:`), logging (`log:`) and
// validation (`eval:`).
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct RunConfig {
  std::string dir = "runs/default";  // run directory (config, metrics, logs, checkpoints)
  int64_t seed = 1337;               // seeds model init, dropout and data order
  bool skip_memory_check = false;    // start even when the memory estimate exceeds what is available
};

struct TrainConfig {
  int64_t max_steps = 1000;       // optimizer steps
  int64_t micro_batch_size = 8;   // sequences per forward/backward
  int64_t grad_accum = 1;         // micro-batches per optimizer step
  int64_t threads = 0;            // LibTorch intra-op threads; 0 = 1 on CPU, LibTorch's default on CUDA
  std::string device = "auto";    // auto | cpu | cuda
  double ema_decay = 0.0;         // EMA of the weights, updated every step; 0 = off
  std::string dtype = "fp32";     // fp32 | bf16 (CUDA autocast; fp32 master weights and optimizer state)
  bool bf16() const { return dtype == "bf16"; }  // the one comparison of the choice
};

struct LogConfig {
  int64_t every_steps = 10;     // console line, metrics.jsonl and TensorBoard record every N steps
  double peak_tflops = 0;       // per-device peak for MFU; 0 = built-in table (H100/H200/A100), else unknown
  double long_window_s = 3600;  // long-window aggregates (mean/min/max tokens/s and MFU) every N seconds
  bool tensorboard = true;      // TensorBoard event file in RUN_DIR
  std::string profile_steps;    // "A-B": Chrome trace of steps A..B in RUN_DIR/profile/; "" = off
};

struct AnomalyConfig {
  double spike_factor = 3.0;     // loss above this times its running mean is a spike; 0 = off
  int64_t window = 50;           // steps in the running mean
  int64_t warmup_steps = 50;     // no spike checks before this step (non-finite values always count)
  std::string action = "skip";   // continue | skip (no weight update) | stop (checkpoint, exit 1)
  int64_t max_dumps = 20;        // anomaly directories written at most

  // The one comparison of each action.
  bool stops() const { return action == "stop"; }
  bool continues() const { return action == "continue"; }
  bool skips() const { return action == "skip"; }
};

struct EvalConfig {
  int64_t every_steps = 0;  // validation loss every N steps (and at the end); 0 = only at the end
  int64_t batches = 20;     // validation micro-batches per evaluation; 0 = no validation
};

}  // namespace lm
