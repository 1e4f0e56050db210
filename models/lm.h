// What every architecture's module is to the rest of the code: a causal language model over a
// padded vocabulary, with an optional key/value cache for generation. The trainer, evaluation,
// checkpoints and generation hold an `LM` (built by models/build.h) and never name an architecture.
#pragma once

#include <torch/torch.h>

#include <vector>

#include "models/model_config.h"

namespace lm {

// Keys and values of the positions seen so far, per layer: (B, kv heads, pos, head width).
struct KVCache {
  std::vector<torch::Tensor> k, v;
  int64_t pos = 0;  // positions held
  void clear() { k.clear(), v.clear(), pos = 0; }
};

struct LMImpl : torch::nn::Module {
  LMImpl(const ModelConfig& c, int64_t vocab_size) : cfg(c), vocab(vocab_size) {}

  // idx: (B, t) int64 -> logits (B, t, V). Without a cache idx starts at position 0 (t <= seq_len);
  // with one, idx holds positions cache->pos .. pos+t-1 (pos+t <= seq_len), attends to the cached
  // ones too, and its keys/values are appended (eval only: no dropout).
  virtual torch::Tensor forward(const torch::Tensor& idx, KVCache* cache) = 0;
  torch::Tensor forward(const torch::Tensor& idx) { return forward(idx, nullptr); }
  // Mean next-token cross-entropy over targets != -1. idx, targets: (B, T) int64.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // The same, summed over targets != -1 (the trainer divides by the step's token count).
  torch::Tensor loss_sum(const torch::Tensor& idx, const torch::Tensor& targets);
  // Redraws every weight as the architecture initialises it (default generator).
  virtual void init_weights() = 0;
  int64_t num_params() const;  // unique parameters (a tied head counted once)

  ModelConfig cfg;
  int64_t vocab;
};
TORCH_MODULE(LM);

// Appends this layer's new keys/values (B, h, t, hd) to the cache and returns all of them.
std::pair<torch::Tensor, torch::Tensor> cache_append(KVCache* cache, size_t layer, torch::Tensor k, torch::Tensor v);

}  // namespace lm
