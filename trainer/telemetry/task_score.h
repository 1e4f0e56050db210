// One downstream task's score at one evaluation (eval.tasks, trainer/eval/task_eval.h), as the records
// (metrics.jsonl "task", TensorBoard, summary.json) carry it. Torch-free, header-only.
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct TaskScore {
  std::string name;
  int64_t examples = 0;   // every rank's together
  int64_t truncated = 0;  // examples with a context + choice cut from the left to model.seq_len
  double acc = 0;         // share of examples whose highest log-likelihood choice is the label
  double acc_norm = 0;    // the same with each log-likelihood divided by the choice's byte length
};

}  // namespace lm
