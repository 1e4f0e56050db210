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
  // auto | on | off: the update as at::_fused_adamw_, skipped on the device when a step is not
  // finite (found_inf), so the host may read a step's results one step late. auto: on CUDA where
  // LibTorch has the kernel (>= 2.1); on: also on the CPU (kernel from LibTorch 2.4; refused
  // before); off: the flat update (CPU: one fused multi-threaded loop; CUDA: tensor ops).
  std::string fused = "auto";
};

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | linear | constant (all after linear warmup)
  int64_t warmup_steps = 100;   // linear warmup from 0 to optim.lr
  double min_lr_ratio = 0.1;    // cosine/linear end at lr * min_lr_ratio
  int64_t decay_steps = 0;      // steps at which decay ends; 0 = train.max_steps
};

}  // namespace lm
