// What every architecture's module is to the rest of the code: a causal language model over a
// padded vocabulary, with an optional key/value cache for generation. The trainer, evaluation,
// checkpoints and generation hold an `LM` (built by models/build.h) and never name an architecture.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <vector>

#include "models/model_config.h"

namespace lm {

// Keys and values of the positions seen so far, per layer: (B, kv heads, pos, head width).
struct KVCache {
  std::vector<torch::Tensor> k, v;
  int64_t pos = 0;  // positions held
  void clear() { k.clear(), v.clear(), pos = 0; }
};

// How the forward and the training loss compute, set by the trainer (train.fused_loss,
// train.bf16_residual, train.activation_checkpointing); not part of the weights. The defaults are
// the plain path.
struct Numerics {
  bool fused_loss = false;     // loss_sum() through the fused head + loss (models/head_loss.h)
  bool bf16_residual = false;  // under autocast, the residual stream and the norms in autocast's dtype
  // Each block keeps only its input for the backward and is run again there
  // (models/recompute.h); when training with grad, without a cache (recompute_blocks_now()).
  bool recompute_blocks = false;
  // loss_terms(): the z-loss z_loss x logsumexp(logits)^2 per target token beside the cross-entropy
  // (optim.z_loss); 0 = none (loss_terms() is loss_sum()).
  double z_loss = 0;
  // data.doc_mask: the EOS id whose documents the forward keeps apart (doc_mask_of below); -1 = off,
  // the window is one sequence. Only without a KV cache (generation crops its context to the
  // document instead: trainer/generate/generate.h).
  int64_t doc_eos = -1;
};

// The documents of packed windows (data.doc_mask): a document ends at its EOS token, the token after
// an EOS starts the next one, and a window's first token starts one (a document cut by the window's
// edge is the piece inside). start (B, T) int64: the index of the first token of each position's
// document; pos (B, T) int64: the position inside it (arange - start). Attention lets query i see
// key j iff start[i] <= j <= i; positions (GPT's learned ones, Llama's RoPE) restart at 0 with each
// document. Undefined tensors: no document mask.
struct DocMask {
  torch::Tensor start, pos;
  bool defined() const { return start.defined(); }
};
// From the input tokens idx (B, T) and the EOS id, on idx's device.
DocMask doc_mask_of(const torch::Tensor& idx, int64_t eos);

// Told around each use of a unit's weights by whoever keeps them elsewhere between uses (weights
// sharded over ranks: trainer/parallel/ gathers a unit before it runs and releases it after). Unit
// i < number of blocks is block i; the last unit is the rest (embeddings, final norm, head), whose
// use starts with hidden() and lasts until the model's backward has produced its gradients.
struct UnitHooks {
  virtual ~UnitHooks() = default;
  // Before unit u's forward (a block's first run, or hidden() for the rest): its weights whole
  // when this returns.
  virtual void before_forward(size_t unit) = 0;
  // After block u's forward: its weights may go until before_backward(u).
  virtual void after_forward(size_t unit) = 0;
  // Block u's output gradient arrived (a hook on its output): its backward, or its recompute under
  // activation checkpointing, runs next and needs its weights whole.
  virtual void before_backward(size_t unit) = 0;
};

// Where init_weights() and model.init_from put a parameter's values when the model was built with
// placeholders (build_model_deferred, models/build.h): handed the parameter and its values, whole, on
// the CPU, one parameter at a time; whoever keeps the weights copies the part it keeps
// (trainer/optim/flat_params.h FlatParams::write). Unset: the values are drawn into the parameter.
using WeightWriter = std::function<void(const torch::Tensor& param, const torch::Tensor& values)>;

// A deferred build's stand-in for a parameter: its shape, dtype float and device, and no memory
// (one zero, expanded: every stride 0).
torch::Tensor placeholder(at::IntArrayRef shape, const torch::Device& device);
bool is_placeholder(const torch::Tensor& t);
// Every parameter of m made a placeholder on `device` (set_data: the modules' own members follow),
// its memory released.
void to_placeholders(torch::nn::Module& m, const torch::Device& device);

// The training objective's terms, summed over targets != -1 (the trainer back-propagates ce + z and
// logs them apart): the cross-entropy, and the z-loss (undefined where numerics.z_loss is 0).
struct LossTerms {
  torch::Tensor ce, z;
};

struct LMImpl : torch::nn::Module {
  LMImpl(const ModelConfig& c, int64_t vocab_size) : cfg(c), vocab(vocab_size) {}

  // idx: (B, t) int64 -> logits (B, t, V): hidden() times head_weight()^T. Without a cache idx
  // starts at position 0 (t <= seq_len); with one, idx holds positions cache->pos .. pos+t-1
  // (pos+t <= seq_len), attends to the cached ones too, and its keys/values are appended (eval
  // only: no dropout).
  torch::Tensor forward(const torch::Tensor& idx, KVCache* cache);
  torch::Tensor forward(const torch::Tensor& idx) { return forward(idx, nullptr); }
  // The same split in two: the final norm's output (B, t, C) (fp32, or bf16 under
  // numerics.bf16_residual) and the head's weight (V, C) (a tied head: the token embedding's).
  virtual torch::Tensor hidden(const torch::Tensor& idx, KVCache* cache) = 0;
  virtual torch::Tensor head_weight() = 0;
  // Mean next-token cross-entropy over targets != -1. idx, targets: (B, T) int64. Always the plain
  // path (fp32 logits), whatever numerics says: the validation loss stays the reference.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // The same, summed over targets != -1 (the trainer divides by the step's token count); through
  // the fused head + loss when numerics.fused_loss.
  torch::Tensor loss_sum(const torch::Tensor& idx, const torch::Tensor& targets);
  // loss_sum() and, where numerics.z_loss > 0, the z-loss from the same logits (the plain path's
  // cross_entropy_z_sum or the fused head's fused_head_loss_z_sum).
  LossTerms loss_terms(const torch::Tensor& idx, const torch::Tensor& targets);
  // Draws every weight as the architecture initialises it (default generator), one parameter after
  // another in the architecture's order: into the parameters themselves (write unset), or each into
  // a scratch tensor of its shape on the CPU handed to `write` (the same draws, the same values).
  virtual void init_weights(const WeightWriter& write) = 0;
  int64_t num_params() const;  // unique parameters (a tied head counted once)
  // The transformer blocks, in order (units 0.. of UnitHooks; every other parameter is the rest).
  virtual torch::nn::ModuleList block_list() const = 0;

  ModelConfig cfg;
  int64_t vocab;
  Numerics numerics;
  // Unset: nothing is told (the weights stay where they are).
  std::shared_ptr<UnitHooks> unit_hooks;

 protected:
  // Block i's forward f(x), under activation checkpointing when `checkpoint` (params: the block's
  // parameters, models/recompute.h), with unit_hooks told around it.
  torch::Tensor run_block(size_t i, std::function<torch::Tensor(const torch::Tensor&)> f, const torch::Tensor& x,
                          bool checkpoint, const torch::nn::Module& block);
  // The rest's use begins (hidden()'s first line).
  void rest_used() {
    if (unit_hooks) unit_hooks->before_forward(block_list()->size());
  }
  // Whether this forward checkpoints its blocks: numerics.recompute_blocks, in training mode, with
  // grad enabled and no KV cache (evaluation and generation keep nothing for a backward anyway).
  bool recompute_blocks_now(const KVCache* cache) const {
    return numerics.recompute_blocks && !cache && is_training() && torch::GradMode::is_enabled();
  }
  // A submodule just made: with a deferred build (device given), its parameters made placeholders.
  static void made(torch::nn::Module& m, const torch::Device* deferred) {
    if (deferred) to_placeholders(m, *deferred);
  }
  // One parameter of init_weights(): `fill` applied to p itself, or with a writer to a CPU scratch of
  // p's shape, then written.
  static void draw(const torch::Tensor& p, const WeightWriter& write, const std::function<void(torch::Tensor&)>& fill);
  // The documents of idx when numerics.doc_eos >= 0 and there is no KV cache; else undefined.
  DocMask doc_mask_now(const torch::Tensor& idx, const KVCache* cache) const {
    return numerics.doc_eos >= 0 && !cache ? doc_mask_of(idx, numerics.doc_eos) : DocMask{};
  }
};
TORCH_MODULE(LM);

// Appends this layer's new keys/values (B, h, t, hd) to the cache and returns all of them.
std::pair<torch::Tensor, torch::Tensor> cache_append(KVCache* cache, size_t layer, torch::Tensor k, torch::Tensor v);

}  // namespace lm
