// The attention shim the models need: causal self-attention over (B, H, T, hd) heads, on the
// fastest kernel this LibTorch offers (see common/torch/compat.h for the version switch).
#pragma once

#include <torch/torch.h>

#include <string>

#include "models/model_config.h"

namespace lm {

// Causal self-attention. q, k, v: (B, H, T, hd) -> (B, H, T, hd). With k, v of S > T positions
// (a KV cache), q holds the last T of them (plain kernel, no dropout).
// LibTorch >= 2.0: at::scaled_dot_product_attention (flash / memory-efficient / cuDNN kernels).
// 1.13: the plain softmax(q k^T / sqrt(hd) + causal mask) v; one baddbmm applies the scale and a
// cached additive mask (0 / -inf) per head, so neither costs a pass of its own. dropout_p applies
// to the attention weights, only when `train`.
// With docs (data.doc_mask, models/lm.h; no KV cache): query i sees keys start[i] .. i only, a
// block-diagonal causal mask: LibTorch >= 2.0 gives SDPA the boolean mask (B, 1, T, T) (on CUDA the
// memory-efficient kernel takes it, flash does not: describe_attention says which runs); 1.13 adds
// it as the -inf bias of its baddbmm.
struct KVCache;
struct DocMask;
torch::Tensor causal_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               double dropout_p, bool train, const DocMask* docs = nullptr);
// The mask above: (B, 1, T, T) bool, true where query i may see key j (start[i] <= j <= i).
torch::Tensor doc_attention_mask(const DocMask& docs);

// Causal self-attention of a packed qkv (B, T, 3C) as q | k | v of n_head heads -> (B, T, C), heads
// side by side. With a cache, this layer's keys/values are appended and attended to (lm.h). On
// LibTorch 1.13 on CPU float32, without a cache or dropout: the fused kernel (models/cpu_kernels.h,
// no split, transposes or concatenation; with docs, one document block at a time, skipping the
// blocks that the mask removes); otherwise causal_attention above.
torch::Tensor causal_self_attention(const torch::Tensor& qkv, int64_t n_head, double dropout_p, bool train,
                                    KVCache* cache = nullptr, size_t layer = 0, const DocMask* docs = nullptr);

// The heads side by side: y (B, H, T, hd) -> (B, T, H*hd); a view where y's transpose is already
// contiguous (flash and cuDNN attention allocate their output as (B, T, H, hd)), else one copy.
torch::Tensor merge_heads(const torch::Tensor& y);

// One line for the trainer's start: which kernel the model's attention runs for its real shape
// (batch x model.seq_len, model.n_head heads), dtype and device, and whether merging its output's
// heads copies, e.g. "attention: flash attention (at::_fused_sdp_choice = 1; bf16, cuda:0,
// B=16 H=12 T=1024 hd=64), output (B,T,C) without a copy". LibTorch >= 2.0 runs the attention once
// to see the output's layout (as in training: q, k, v requiring grad when `train`, model.dropout);
// 1.13 names the fused CPU kernel or the plain one. doc_mask (data.doc_mask): the kernel that runs
// with the documents' mask (SDPA's choice for a boolean mask; the fused kernel per document block).
std::string describe_attention(const ModelConfig& c, int64_t batch, at::ScalarType dtype, const torch::Device& device,
                               bool train, bool doc_mask = false);

}  // namespace lm
