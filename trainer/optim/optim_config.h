// Configuration of the optimizer (`optim:`) and the learning-rate schedule (`schedule:`).
// The keys' descriptions and allowed values are in describe() in trainer/config.cpp; `trainer --keys`
// prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct OptimConfig {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;
  // fused: the step is skipped on the device when it is not finite (found_inf), so the host may read
  // a step's results one step late; on is refused on the CPU before LibTorch 2.4; off is the flat
  // update (CPU: one fused multi-threaded loop; CUDA: tensor ops).
  std::string fused = "auto";
  // free_grads: per-parameter gradients, undefined between steps (backward allocates them), instead of
  // views of one flat buffer zeroed every step; needs the fused AdamW and world size 1 (DDP
  // all-reduces the flat buffer). clip_in_step: the clip coefficient goes to the fused AdamW as its
  // grad_scale instead of a pass over the gradients. auto: on CUDA where the fused AdamW runs.
  std::string free_grads = "auto";
  std::string clip_in_step = "auto";
};

struct ScheduleConfig {
  std::string kind = "cosine";
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.1;
  int64_t decay_steps = 0;
};

}  // namespace lm
