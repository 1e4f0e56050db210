// The memory a training run needs, estimated before anything is allocated, so a config that
// cannot fit is refused with one line (exit 2) instead of allocating until the machine gives out.
#pragma once

#include <cstdint>
#include <string>

#include <torch/torch.h>

#include "run/config/config.h"

namespace lm {

struct MemoryEstimate {
  double params = 0;       // bytes: fp32 weights
  double optimizer = 0;    // bytes: gradients, AdamW moments, EMA weights
  double activations = 0;  // bytes: one micro-batch's saved activations and logits
  double staging = 0;      // bytes: checkpoint.async's host copy of the saved state (weights, moments, EMA)
  std::string stage;       // what each rank keeps, in words (the parallelism's: rank_bytes)
  double total() const { return params + optimizer + activations + staging; }
};

// Parameters 4N, gradients 4N, the optimizer's state (AdamW 8N: optimizer_kinds()), EMA 4N, each as
// much as the parallelism keeps on a rank (rank_bytes, trainer/parallel/parallel.h) (N: the parameters model.arch builds,
// models/registry.h param_count: GQA, the SwiGLU width, an untied head counted); activations per
// layer ~ B*T*(34d + 5*H*T) 16-bit values for gpt (Korthikanti et al., 2022), the same count of
// llama's tensors for llama (memory_check.cpp), doubled for fp32, plus 3 B*T*V fp32 values for
// the logits and their gradients (2 B*T*V values in the compute dtype with train.fused_loss on,
// resolved for a CUDA device when `cuda`); with train.activation_checkpointing=block, one (B,T,C)
// input per layer (fp32, bf16 under train.bf16_residual) and one layer's activations instead of L
// layers'; with async checkpoints,
// the staging buffer (12N, 16N with EMA; in host memory, counted against a CPU device only,
// allocated at start), a rank staging what it keeps. An estimate, not a bound.
MemoryEstimate estimate_memory(const ExperimentConfig& cfg, int64_t vocab, bool cuda = false, int world_size = 1);

// Throws ConfigError naming the estimate and the memory available when the estimate exceeds it
// (unless cfg.run.skip_memory_check, or the available memory is unknown).
void check_memory_fits(const ExperimentConfig& cfg, int64_t vocab, const torch::Device& device, int world_size = 1);

}  // namespace lm
