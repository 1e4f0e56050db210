// The `gpt` architecture: a GPT-2 style decoder, single-device (parallelism is applied from outside).
//
// Exactly the reference in shared/peers/gpt_torch.py: learned absolute positions, pre-LayerNorm
// blocks (fused qkv Linear with bias, causal attention, output projection; GELU-tanh MLP of width
// 4*d), final LayerNorm, LM head tied to the token embedding; optional dropout on embeddings,
// attention weights and residual branches. Parameter names match the peer ("wte.weight",
// "blocks.0.qkv.bias", ...). GPT-2 124M (12/12/768/1024, vocab 50304) has 124,475,904 parameters.
#pragma once

#include <torch/torch.h>

#include "models/model_config.h"

namespace lm {

struct BlockImpl : torch::nn::Module {
  BlockImpl(const ModelConfig& c);
  // x: (B, T, C) -> (B, T, C)
  torch::Tensor forward(const torch::Tensor& x);

  int64_t n_head;
  double dropout;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct GPTImpl : torch::nn::Module {
  // vocab_size: the padded vocabulary (see padded_vocab()).
  GPTImpl(const ModelConfig& c, int64_t vocab_size);

  // idx: (B, T) int64, T <= seq_len -> logits (B, T, V) float.
  torch::Tensor forward(const torch::Tensor& idx);
  // Mean next-token cross-entropy over targets != -1. idx, targets: (B, T) int64.
  torch::Tensor loss(const torch::Tensor& idx, const torch::Tensor& targets);
  // The same, summed over targets != -1 (the trainer divides by the step's token count).
  torch::Tensor loss_sum(const torch::Tensor& idx, const torch::Tensor& targets);

  // GPT-2 init: N(0, init_std) for matrices and embeddings, residual projections scaled by
  // 1/sqrt(2*n_layer), zero biases, unit LayerNorm. Draws from the default generator.
  void init_weights();
  int64_t num_params() const;  // unique parameters (the tied head counted once)

  ModelConfig cfg;
  int64_t vocab;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm lnf{nullptr};
};
TORCH_MODULE(GPT);

// vocab rounded up to a multiple of c.vocab_multiple.
int64_t padded_vocab(const ModelConfig& c, int64_t data_vocab);
// Training (forward + backward) matmul FLOPs per token at context length `context`, the MFU
// numerator: 6 * (12*L*d^2 [qkv, attention out, MLP] + V*d [the LM head, tied to the token
// embedding: a matmul, counted once]) + 12*L*d*context [QK^T and AV] (PaLM appendix B, matmuls
// only: the token and position embeddings are lookups, layer norms, biases, GELU and softmax are
// not counted). vocab: the padded vocabulary the head computes.
double matmul_flops_per_token(const ModelConfig& c, int64_t vocab, int64_t context);

}  // namespace lm
