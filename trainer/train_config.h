// Configuration of the run (`run:`), the training loop (`train:`), logging (`log:`) and
// validation (`eval:`).
// The keys' descriptions and allowed values are in describe() in trainer/config.cpp; `trainer --keys`
// prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lm {

struct RunConfig {
  std::string dir = "runs/default";
  int64_t seed = 1337;
  bool skip_memory_check = false;
};

struct TrainConfig {
  int64_t max_steps = 1000;
  int64_t micro_batch_size = 8;
  int64_t grad_accum = 1;
  int64_t threads = 0;
  std::string device = "auto";
  double ema_decay = 0.0;
  std::string dtype = "fp32";
  std::string fused_loss = "auto";
  bool bf16_residual = false;
  std::string activation_checkpointing = "none";
  bool bf16() const { return dtype == "bf16"; }  // the one comparison of the choice
  // The one resolution of train.fused_loss: auto = on CUDA.
  bool fused_loss_on(bool cuda) const { return fused_loss == "on" || (fused_loss == "auto" && cuda); }
  bool recompute_blocks() const { return activation_checkpointing == "block"; }  // the one comparison
};

struct LogConfig {
  int64_t every_steps = 10;
  double peak_tflops = 0;
  double long_window_s = 3600;
  bool tensorboard = true;
  std::string profile_steps;
};

struct AnomalyConfig {
  double spike_factor = 3.0;
  int64_t window = 50;
  int64_t warmup_steps = 50;
  std::string action = "skip";
  int64_t max_dumps = 20;

  // The one comparison of each action.
  bool stops() const { return action == "stop"; }
  bool continues() const { return action == "continue"; }
  bool skips() const { return action == "skip"; }
};

// One downstream task (eval.tasks): a JSONL file of {"context", "choices", "label"} examples,
// scored by the model's log-likelihood of each choice (trainer/eval/task_eval.h).
struct TaskConfig {
  std::string name;                     // the metrics' name: [A-Za-z0-9_.-]+, unique
  std::string path;                     // the JSONL file
  std::string kind = "multiple_choice";  // the one kind
};

struct EvalConfig {
  int64_t every_steps = 0;
  int64_t batches = 20;
  std::vector<TaskConfig> tasks;
  // Whether an evaluation runs after optimizer step `step`: every every_steps steps but the last
  // (the end of the run evaluates once, whatever the step).
  bool due(int64_t step, int64_t max_steps) const {
    return every_steps > 0 && step % every_steps == 0 && step != max_steps;
  }
};

}  // namespace lm
