// The `gpt` architecture: a GPT-2 style decoder, single-device (parallelism is applied from outside).
//
// Exactly the Python peer bench/peers/gpt_torch.py: learned absolute positions, pre-LayerNorm
// blocks (fused qkv Linear with bias, causal attention, output projection; GELU-tanh MLP of width
// 4*d), final LayerNorm, LM head tied to the token embedding; optional dropout on embeddings,
// attention weights and residual branches. Parameter names match the peer ("wte.weight",
// "blocks.0.qkv.bias", ...). GPT-2 124M (12/12/768/1024, vocab 50304) has 124,475,904 parameters.
#pragma once

#include <torch/torch.h>

#include "models/lm.h"
#include "models/model_config.h"
#include "models/registry.h"

namespace lm {

struct BlockImpl : torch::nn::Module {
  BlockImpl(const ModelConfig& c);
  // x: (B, T, C) -> (B, T, C) in x's dtype; with a cache, x holds the positions after the cached ones;
  // docs: the documents' attention mask (data.doc_mask, lm.h), or null.
  torch::Tensor forward(const torch::Tensor& x, KVCache* cache = nullptr, size_t layer = 0,
                        const DocMask* docs = nullptr);

  int64_t n_head;
  double dropout;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc2{nullptr};
};
TORCH_MODULE(Block);

struct GPTImpl : LMImpl {
  // vocab_size: the padded vocabulary (see padded_vocab()). deferred: every parameter a placeholder
  // on that device, each submodule's made one after another (LibTorch's resets draw as without it),
  // and init_weights() left to the caller (models/build.h build_model_deferred); null: initialised here.
  GPTImpl(const ModelConfig& c, int64_t vocab_size, const torch::Device* deferred = nullptr);

  // idx: (B, T) int64, T <= seq_len -> lnf's output (B, T, C); under numerics.bf16_residual and
  // autocast, the residual stream from the embeddings on, the LayerNorms and this output are in
  // autocast's dtype (llm.c's layout), else fp32 (LayerNorm autocasts to fp32). Under
  // numerics.doc_eos (data.doc_mask) the learned positions restart at each document.
  torch::Tensor hidden(const torch::Tensor& idx, KVCache* cache) override;
  torch::Tensor head_weight() override { return wte->weight; }  // tied head
  torch::nn::ModuleList block_list() const override { return blocks; }

  // GPT-2 init: N(0, init_std) for matrices and embeddings, residual projections scaled by
  // 1/sqrt(2*n_layer), zero biases, unit LayerNorm. Draws from the default generator.
  void init_weights(const WeightWriter& write) override;

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm lnf{nullptr};
};
TORCH_MODULE(GPT);

}  // namespace lm
