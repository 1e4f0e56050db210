// The Llama decoder (see llama.h).
#include "models/llama.h"

#include <cmath>

#include "common/torch/compat.h"
#include "models/attention.h"
#include "models/recompute.h"
#include "models/registry.h"

namespace lm {
namespace {

torch::nn::Linear linear_no_bias(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// PyTorch's nn.init.trunc_normal_: inverse-CDF sampling within [a, b].
void trunc_normal(torch::Tensor t, double std, double a, double b) {
  auto cdf = [](double x) { return (1.0 + std::erf(x / std::sqrt(2.0))) / 2.0; };
  const double l = cdf(a / std), u = cdf(b / std);
  t.uniform_(2 * l - 1, 2 * u - 1).erfinv_().mul_(std * std::sqrt(2.0)).clamp_(a, b);
}

}  // namespace

RMSNormImpl::RMSNormImpl(int64_t dim, double e) : eps(e) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto xf = x.to(torch::kFloat);
  // In x's dtype (a bf16 residual stream: the weight cast to bf16; fp32: `to` returns the weight).
  return (xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps)).to(x.scalar_type()) * weight.to(x.scalar_type());
}

torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  auto shape = x.sizes().vec();
  auto pairs = x.reshape({shape[0], shape[1], shape[2], shape[3] / 2, 2});
  auto x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);  // (B, T, h, hd/2)
  // (T, hd/2): the same positions in every row; (B, T, hd/2): per row (data.doc_mask).
  auto c = cos.dim() == 3 ? cos.unsqueeze(2) : cos.view({1, cos.size(0), 1, cos.size(1)});
  auto s = sin.dim() == 3 ? sin.unsqueeze(2) : sin.view({1, sin.size(0), 1, sin.size(1)});
  return torch::stack({x0 * c - x1 * s, x0 * s + x1 * c}, -1).view(shape).to(x.scalar_type());
}

LlamaAttentionImpl::LlamaAttentionImpl(const ModelConfig& c)
    : n_head(c.n_head), n_kv_head(kv_heads(c)), head_dim(c.d_model / c.n_head) {
  wq = register_module("wq", linear_no_bias(c.d_model, n_head * head_dim));
  wk = register_module("wk", linear_no_bias(c.d_model, n_kv_head * head_dim));
  wv = register_module("wv", linear_no_bias(c.d_model, n_kv_head * head_dim));
  wo = register_module("wo", linear_no_bias(n_head * head_dim, c.d_model));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                          KVCache* cache, size_t layer, const DocMask* docs) {
  const int64_t B = x.size(0), T = x.size(1);
  auto q = apply_rope(wq->forward(x).view({B, T, n_head, head_dim}), cos, sin).transpose(1, 2);
  auto k = apply_rope(wk->forward(x).view({B, T, n_kv_head, head_dim}), cos, sin).transpose(1, 2);
  auto v = wv->forward(x).view({B, T, n_kv_head, head_dim}).transpose(1, 2);  // (B, h_kv, T, hd)
  if (cache) std::tie(k, v) = cache_append(cache, layer, k, v);
  if (n_kv_head != n_head) {  // each kv head serves n_head / n_kv_head consecutive query heads
    const int64_t rep = n_head / n_kv_head, S = k.size(2);
    k = k.unsqueeze(2).expand({B, n_kv_head, rep, S, head_dim}).reshape({B, n_head, S, head_dim});
    v = v.unsqueeze(2).expand({B, n_kv_head, rep, S, head_dim}).reshape({B, n_head, S, head_dim});
  }
  auto y = causal_attention(q, k, v, 0.0, is_training(), docs);  // (B, H, T, hd)
  return wo->forward(merge_heads(y));
}

FeedForwardImpl::FeedForwardImpl(const ModelConfig& c) {
  const int64_t h = ffn_hidden(c);
  w1 = register_module("w1", linear_no_bias(c.d_model, h));
  w2 = register_module("w2", linear_no_bias(h, c.d_model));
  w3 = register_module("w3", linear_no_bias(c.d_model, h));
}

torch::Tensor FeedForwardImpl::forward(const torch::Tensor& x) {
  return w2->forward(torch::silu(w1->forward(x)) * w3->forward(x));
}

LlamaBlockImpl::LlamaBlockImpl(const ModelConfig& c) {
  attention = register_module("attention", LlamaAttention(c));
  feed_forward = register_module("feed_forward", FeedForward(c));
  attention_norm = register_module("attention_norm", RMSNorm(c.d_model, c.norm_eps));
  ffn_norm = register_module("ffn_norm", RMSNorm(c.d_model, c.norm_eps));
}

torch::Tensor LlamaBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                      KVCache* cache, size_t layer, const DocMask* docs) {
  auto h = x + attention->forward(attention_norm->forward(x), cos, sin, cache, layer, docs);
  return h + feed_forward->forward(ffn_norm->forward(h));
}

LlamaImpl::LlamaImpl(const ModelConfig& c, int64_t vocab_size, const torch::Device* deferred) : LMImpl(c, vocab_size) {
  tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(vocab_size, c.d_model));
  made(*tok_embeddings, deferred);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    LlamaBlock block(c);
    made(*block, deferred);
    layers->push_back(block);
  }
  norm = register_module("norm", RMSNorm(c.d_model, c.norm_eps));
  made(*norm, deferred);
  if (!c.tie_embeddings) {
    output = register_module("output", linear_no_bias(c.d_model, vocab_size));
    made(*output, deferred);
  }
  // Meta's precompute_freqs_cis, in fp32: angle(t, i) = t * theta^(-2i/hd).
  const int64_t hd = c.d_model / c.n_head;
  auto freqs = 1.0 / torch::pow(c.rope_theta, torch::arange(0, hd, 2, torch::kFloat).slice(0, 0, hd / 2) / hd);
  auto angles = torch::outer(torch::arange(c.seq_len, torch::kFloat), freqs);  // (seq_len, hd/2)
  cos_ = angles.cos();
  sin_ = angles.sin();
  if (!deferred) init_weights(nullptr);
}

void LlamaImpl::init_weights(const WeightWriter& write) {
  const double std = cfg.init_std;
  const double emb_std = cfg.tie_embeddings ? std : 1.0;
  draw(tok_embeddings->weight, write, [emb_std](torch::Tensor& t) { t.normal_(0.0, emb_std); });
  auto ones = [](torch::Tensor& t) { t.fill_(1.0); };
  for (size_t l = 0; l < layers->size(); ++l) {
    auto* b = layers[l]->as<LlamaBlock>();
    const double depth_std = std / std::sqrt(2.0 * static_cast<double>(l + 1));
    for (auto* w : {&b->attention->wq, &b->attention->wk, &b->attention->wv, &b->feed_forward->w1})
      draw((*w)->weight, write, [std](torch::Tensor& t) { trunc_normal(t, std, -2, 2); });
    for (auto* w : {&b->attention->wo, &b->feed_forward->w2, &b->feed_forward->w3})
      draw((*w)->weight, write, [depth_std](torch::Tensor& t) { trunc_normal(t, depth_std, -2, 2); });
    draw(b->attention_norm->weight, write, ones);
    draw(b->ffn_norm->weight, write, ones);
  }
  draw(norm->weight, write, ones);
  if (output) {
    const double out_std = 1.0 / std::sqrt(static_cast<double>(cfg.d_model));
    draw(output->weight, write, [out_std](torch::Tensor& t) { trunc_normal(t, out_std, -3 * out_std, 3 * out_std); });
  }
}

torch::Tensor LlamaImpl::hidden(const torch::Tensor& idx, KVCache* cache) {
  const int64_t T = idx.size(1), P = cache ? cache->pos : 0;
  TORCH_CHECK(P + T <= cfg.seq_len, "sequence of ", P + T, " tokens exceeds model.seq_len=", cfg.seq_len);
  if (cos_.device() != idx.device()) cos_ = cos_.to(idx.device()), sin_ = sin_.to(idx.device());
  auto cos = cos_.slice(0, P, P + T), sin = sin_.slice(0, P, P + T);
  const DocMask docs = doc_mask_now(idx, cache);  // data.doc_mask: RoPE's positions restart at each document
  if (docs.defined()) {
    const int64_t B = idx.size(0), half = cos_.size(1);
    cos = cos_.index_select(0, docs.pos.reshape({-1})).view({B, T, half});
    sin = sin_.index_select(0, docs.pos.reshape({-1})).view({B, T, half});
  }
  rest_used();
  auto h = tok_embeddings->forward(idx);  // (B, T, C)
  if (numerics.bf16_residual)
    if (auto dtype = compat::autocast_dtype(idx.device().type())) h = h.to(*dtype);
  const bool checkpoint = recompute_blocks_now(cache);
  for (size_t i = 0; i < layers->size(); ++i) {
    auto block = layers->ptr<LlamaBlockImpl>(i);
    h = run_block(i, [block, cos, sin, docs, cache, i](const torch::Tensor& in) {
                    return block->forward(in, cos, sin, cache, i, &docs);
                  }, h, checkpoint, *block);
  }
  if (cache) cache->pos += T;
  return norm->forward(h);
}

}  // namespace lm
