// The `llama` architecture: the Llama 2/3 decoder as Meta's reference model.py and torchtitan
// write it, single-device.
//
// Token embedding (no positions), pre-norm blocks: RMSNorm (model.norm_eps, computed in fp32) ->
// attention with rotary embeddings on q and k (model.rope_theta; Meta's interleaved pairs: dims
// 2i and 2i+1 rotate together) and grouped-query attention (model.n_kv_head key/value heads, each
// shared by n_head/n_kv_head query heads) -> residual; RMSNorm -> SwiGLU MLP w2(silu(w1 x) * w3 x)
// of width ffn_hidden() -> residual; final RMSNorm; output head, untied unless model.tie_embeddings.
// No biases, no dropout. Parameter names are torchtitan's ("tok_embeddings.weight",
// "layers.0.attention.wq.weight", "layers.0.feed_forward.w1.weight", "norm.weight", "output.weight").
// Llama 3 8B (32/32 heads, 8 kv heads, 4096, ffn x1.3 multiple of 1024, vocab 128256) has
// 8,030,261,248 parameters (param_count()).
#pragma once

#include <torch/torch.h>

#include "models/lm.h"
#include "models/model_config.h"

namespace lm {

struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

struct LlamaAttentionImpl : torch::nn::Module {
  explicit LlamaAttentionImpl(const ModelConfig& c);
  // x: (B, T, C); cos, sin: (T, hd/2) for the positions of x, or (B, T, hd/2) (data.doc_mask:
  // positions restart at each document); docs: the documents' attention mask (lm.h), or null.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin, KVCache* cache,
                        size_t layer, const DocMask* docs = nullptr);
  int64_t n_head, n_kv_head, head_dim;
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
};
TORCH_MODULE(LlamaAttention);

struct FeedForwardImpl : torch::nn::Module {
  explicit FeedForwardImpl(const ModelConfig& c);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear w1{nullptr}, w2{nullptr}, w3{nullptr};
};
TORCH_MODULE(FeedForward);

struct LlamaBlockImpl : torch::nn::Module {
  explicit LlamaBlockImpl(const ModelConfig& c);
  // x: (B, T, C) -> (B, T, C) in x's dtype: x + attention(norm(x)), then h + feed_forward(norm(h));
  // cos, sin: (T, hd/2) for the positions of x; with a cache, x holds the positions after the cached ones.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                        KVCache* cache = nullptr, size_t layer = 0, const DocMask* docs = nullptr);
  RMSNorm attention_norm{nullptr}, ffn_norm{nullptr};
  LlamaAttention attention{nullptr};
  FeedForward feed_forward{nullptr};
};
TORCH_MODULE(LlamaBlock);

struct LlamaImpl : LMImpl {
  // deferred: as GPTImpl's (gpt.h).
  LlamaImpl(const ModelConfig& c, int64_t vocab_size, const torch::Device* deferred = nullptr);

  // The final norm's output (B, T, C): fp32, or under numerics.bf16_residual and autocast, with
  // the residual stream from the embedding on, in autocast's dtype. Under numerics.doc_eos
  // (data.doc_mask) RoPE's positions restart at each document.
  torch::Tensor hidden(const torch::Tensor& idx, KVCache* cache) override;
  torch::Tensor head_weight() override { return output ? output->weight : tok_embeddings->weight; }
  torch::nn::ModuleList block_list() const override { return layers; }

  // torchtitan's init (depth_init): embedding N(0, 1) (tied: N(0, init_std)); per layer l
  // (0-based) wq, wk, wv, w1 ~ TN(0, init_std), wo, w2, w3 ~ TN(0, init_std / sqrt(2 (l + 1)))
  // (TN: truncated to [-2, 2]); RMSNorm weights 1; output ~ TN(0, d^-1/2) cut at 3 std.
  void init_weights(const WeightWriter& write) override;

  torch::nn::Embedding tok_embeddings{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
  torch::nn::Linear output{nullptr};  // null when tied

 private:
  torch::Tensor cos_, sin_;  // (seq_len, hd/2) rotation tables, not parameters nor buffers
};
TORCH_MODULE(Llama);

// Rotates interleaved pairs of x (B, T, h, hd) by the angles whose cos/sin (T, hd/2) are given, or
// (B, T, hd/2) per row (data.doc_mask).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);

}  // namespace lm
