// Configuration of the optimizer (`optim:`) and the learning-rate schedule (`schedule:`).
// The keys' descriptions and allowed values are in describe() in trainer/config.cpp; `trainer --keys`
// prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lm {

// The optimizers optim.name takes, torch-free (the config checks the name, the memory check reads the
// bytes): each one's name and the bytes of state it keeps per parameter. Its class is made by
// make_optimizer (optimizer.cpp).
struct OptimizerKind {
  const char* name;
  double state_bytes_per_param;
};
inline const std::vector<OptimizerKind>& optimizer_kinds() {
  static const std::vector<OptimizerKind> kinds = {{"adamw", 8}};  // AdamW: two fp32 moments
  return kinds;
}

struct OptimConfig {
  std::string name = "adamw";  // optimizer_kinds()
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
  // z-loss (PaLM): z_loss x logsumexp(logits)^2 added per target token to the objective, logged
  // apart (metrics.jsonl "z_loss"); 0 = off, the loss path exactly as without it.
  double z_loss = 0;
};

// Bytes of state per parameter the optimizer optim.name keeps (the memory check, before anything is
// built).
inline double optimizer_state_bytes_per_param(const OptimConfig& c) {
  for (const auto& k : optimizer_kinds())
    if (c.name == k.name) return k.state_bytes_per_param;
  return 0;  // the config loader refuses an unknown name first
}

struct ScheduleConfig {
  std::string kind = "cosine";  // cosine | linear | constant | wsd (warmup, stable, decay)
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.1;
  // cosine, linear: the step at which the decay ends (0 = train.max_steps); wsd: the decay's length
  // in steps (0 = from decay_fraction, or from the anneal stage to train.max_steps).
  int64_t decay_steps = 0;
  // wsd: the decay's shape (linear, 1-sqrt, cosine) and its length as a share of train.max_steps
  // (0 = decay_steps, or the anneal stage, gives it).
  std::string decay_shape = "linear";
  double decay_fraction = 0;
  // Not a key: wsd's first decay step when a data.stages entry has anneal: true (the stage's first
  // step; set by the config loader from data.stages), else -1.
  int64_t anneal_start = -1;
  bool wsd() const { return kind == "wsd"; }
};

// wsd's decay, steps [start, end) (0-based optimizer steps; the lr falls from optim.lr at `start`
// to optim.lr x min_lr_ratio at `end`, and stays there): start = the anneal stage's first step, or
// max_steps minus the decay's length; length = decay_steps, or round(decay_fraction x max_steps),
// or, from an anneal stage, to max_steps. The config loader refuses a decay that does not fit
// (trainer/config.cpp); the schedule (trainer/optim/schedule.h) and its records read this one rule.
struct DecayWindow {
  int64_t start = 0, end = 0;
};
inline DecayWindow wsd_decay_window(const ScheduleConfig& s, int64_t max_steps) {
  int64_t length = s.decay_steps;
  if (length <= 0 && s.decay_fraction > 0)
    length = static_cast<int64_t>(s.decay_fraction * static_cast<double>(max_steps) + 0.5);
  if (s.anneal_start >= 0) return {s.anneal_start, length > 0 ? s.anneal_start + length : max_steps};
  return {max_steps - length, max_steps};
}

}  // namespace lm
