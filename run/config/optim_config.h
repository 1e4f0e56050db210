// Configuration of the optimizer (`optim:`) and the learning-rate schedule (`schedule:`). Torch-free.
// The keys' descriptions and allowed values are in describe_optim and describe_schedule
// (optim_config.cpp); `trainer --keys` prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lm {
namespace config_schema {
class Schema;
}

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
  std::string fused = "auto";
  std::string free_grads = "auto";
  std::string clip_in_step = "auto";
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
  std::string kind = "cosine";
  int64_t warmup_steps = 100;
  double min_lr_ratio = 0.1;
  int64_t decay_steps = 0;
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
// (run/config/config.cpp); the schedule (trainer/optim/schedule.h) and its records read this one rule.
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

// The optim.* and schedule.* keys into the config schema (run/config/config.cpp's describe()).
void describe_optim(config_schema::Schema& s, OptimConfig& o);
void describe_schedule(config_schema::Schema& s, ScheduleConfig& sc);

}  // namespace lm
