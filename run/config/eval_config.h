// Configuration of validation and the downstream tasks (`eval:`). Torch-free.
// The keys' descriptions and allowed values are in describe_eval (eval_config.cpp); `trainer --keys`
// prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lm {
namespace config_schema {
class Schema;
}

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

// The eval.* keys into the config schema (run/config/config.cpp's describe()).
void describe_eval(config_schema::Schema& s, EvalConfig& e);

}  // namespace lm
