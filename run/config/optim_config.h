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

// The optimizers optim.name takes, torch-free: the one table of what each is and can do. The
// config checks the name, the memory check reads the bytes, resolve_grad_path (flat_params.h) and
// the parallel layout (trainer/parallel/) ask the capabilities, so nothing assumes AdamW's. Its
// class is made by make_optimizer (optimizer.cpp).
struct OptimizerKind {
  const char* name;
  double state_bytes_per_param;  // bytes of state per parameter (the most, where it differs)
  bool fused_kernel;  // has a fused kernel (at::_fused_adamw_): optim.fused may pick it
  bool grad_scale;    // honours FlatParams::grad_scale (clipping inside its step): optim.clip_in_step
  bool free_grads;    // works with per-parameter gradients freed after each update: optim.free_grads
  bool whole_params;  // needs every parameter whole: under ZeRO a rank owns whole tensors, not ranges
};
inline const std::vector<OptimizerKind>& optimizer_kinds() {
  static const std::vector<OptimizerKind> kinds = {
      // AdamW: two fp32 moments, value by value: any cut of the flat buffer.
      {"adamw", 8, /*fused_kernel=*/true, /*grad_scale=*/true, /*free_grads=*/true, /*whole_params=*/false},
      // Muon (muon.h): the matrices' momentum (4 bytes) orthogonalised whole; AdamW's two moments for the rest.
      {"muon", 8, /*fused_kernel=*/false, /*grad_scale=*/false, /*free_grads=*/false, /*whole_params=*/true},
  };
  return kinds;
}
// optim.name's row. REQUIRES: a name the config accepted.
const OptimizerKind& optimizer_kind(const std::string& name);

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
  // Muon (optim.name=muon): the matrices' learning rate at the schedule's peak (the schedule scales it
  // as it scales optim.lr), their momentum, and the Newton-Schulz iterations.
  double muon_lr = 0.02;
  double muon_momentum = 0.95;
  int64_t muon_ns_steps = 5;
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
