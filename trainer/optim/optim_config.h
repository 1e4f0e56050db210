// Configuration of the optimizer (`optim:`) and the learning-rate schedule (`schedule:`).
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct OptimConfig {
  double lr = 3e-4;            // peak learning rate (after warmup)
  double beta1 = 0.9;          // AdamW first-moment decay
  double beta2 = 0.95;         // AdamW second-moment decay
  double eps = 1e-8;           // AdamW denominator epsilon
  double weight_decay = 0.1;   // decoupled; matrices only (not biases, norms, embeddings)
  double grad_clip = 1.0;      // max global grad norm; 0 = no clipping
};

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | linear | constant (all after linear warmup)
  int64_t warmup_steps = 100;   // linear warmup from 0 to optim.lr
  double min_lr_ratio = 0.1;    // cosine/linear end at lr * min_lr_ratio
  int64_t decay_steps = 0;      // steps at which decay ends; 0 = train.max_steps
};

}  // namespace lm
