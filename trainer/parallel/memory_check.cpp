// The up-front memory estimate (see memory_check.h).
#include "trainer/parallel/memory_check.h"

#include "common/errors.h"
#include "common/log.h"
#include "models/registry.h"
#include "trainer/optim/optimizer.h"
#include "trainer/parallel/parallel.h"
#include "trainer/runtime/device.h"

namespace lm {

MemoryEstimate estimate_memory(const ExperimentConfig& cfg, int64_t vocab, bool cuda, int world_size) {
  const ModelConfig& m = cfg.model;
  const double L = static_cast<double>(m.n_layer), T = static_cast<double>(m.seq_len);
  const double V = static_cast<double>(vocab), B = static_cast<double>(cfg.train.micro_batch_size);
  const double n = static_cast<double>(param_count(m, vocab));  // what the module builds, per architecture
  MemoryEstimate e;
  // What a rank keeps of the weights, gradients and optimizer state: the parallelism's answer.
  const RankBytes kept = rank_bytes(cfg.dist, world_size, n, optimizer_state_bytes_per_param(cfg.optim), cfg.train.grad_accum);
  e.stage = kept.stage;
  e.params = kept.weights;
  e.optimizer = kept.grads + kept.optimizer + (cfg.train.ema_decay > 0 ? 4 * n : 0);
  const double value_bytes = cfg.train.bf16() ? 2 : 4;
  // The logits: fp32 values, their fp32 copy's gradient and the loss's (3 B*T*V*4); the fused head + loss
  // keeps the probabilities in the compute dtype, its gradient written into them, beside the logits
  // until the softmax is made (2 B*T*V values).
  const double logits = cfg.train.fused_loss_on(cuda) ? 2 * B * T * V * value_bytes : 3 * B * T * V * 4;
  const double block = B * T * saved_activations_per_token_layer(m) * value_bytes;  // one layer's
  // train.activation_checkpointing=block: each layer keeps its input (B,T,C), the residual stream (fp32,
  // or bf16 under train.bf16_residual), and one block's activations exist at a time (its rerun in
  // the backward).
  const double input = B * T * static_cast<double>(m.d_model) * (cfg.train.bf16() && cfg.train.bf16_residual ? 2 : 4);
  e.activations = (cfg.train.recompute_blocks() ? L * input + block : L * block) + logits;
  if (cfg.checkpoint.async) e.staging = e.params + e.optimizer - kept.grads;  // all but the gradients
  return e;
}

void check_memory_fits(const ExperimentConfig& cfg, int64_t vocab, const torch::Device& device, int world_size) {
  if (cfg.run.skip_memory_check) return;
  MemoryEstimate e = estimate_memory(cfg, vocab, device.is_cuda(), world_size);
  if (device.is_cuda()) e.staging = 0;  // pinned host memory, not the device's
  const double avail = available_memory_bytes(device);
  if (avail <= 0 || e.total() <= avail) return;
  const std::string kept = cfg.train.recompute_blocks()
                              ? " (train.activation_checkpointing=block: one (B,T,C) input per layer and one block's "
                                "activations)"
                              : " (every layer's; train.activation_checkpointing=block keeps one input per layer)";
  throw ConfigError(strf("the config needs an estimated %.1f GB (parameters %.1f GB, gradients and optimizer state "
                         "%.1f GB, activations %.1f GB%s at train.micro_batch_size=%lld, model.seq_len=%lld, async "
                         "checkpoint staging %.1f GB; per rank under %s) but %s has %.1f GB available; shrink "
                         "model.d_model / model.n_layer / model.seq_len / train.micro_batch_size, or set "
                         "run.skip_memory_check=true",
                         e.total() / 1e9, e.params / 1e9, e.optimizer / 1e9, e.activations / 1e9, kept.c_str(),
                         static_cast<long long>(cfg.train.micro_batch_size), static_cast<long long>(cfg.model.seq_len),
                         e.staging / 1e9, e.stage.c_str(), device.str().c_str(), avail / 1e9));
}

}  // namespace lm
