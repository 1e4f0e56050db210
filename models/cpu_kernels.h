// Fused CPU kernels for the stages LibTorch's CPU build does slowly in a GPT step: the GELU, the
// loss and (on 1.13) the attention. Each is one pass forward and one backward, with one exp per
// element (AVX2+FMA where the CPU has it and ATEN_CPU_CAPABILITY is not `default`, a portable loop
// otherwise: the two paths' formulas are the same, their results agree within a few ulp), and each agrees with
// LibTorch's op within float rounding (a few ulp), not bit for bit. An element's (a row's) result
// never depends on how the tensor is split between threads, so a run is reproducible at any thread
// count. Anything but CPU float32 goes to LibTorch's own op (CUDA, bf16, fp64).
#pragma once

#include <torch/torch.h>

namespace lm {

// Which of the two paths the kernels below take in this process: "avx2" or "portable".
const char* cpu_kernels_isa();

// GPT-2's activation, GELU with the tanh approximation, differentiable:
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//           = x * sigmoid(2u)       (the same function: 1 + tanh(u) = 2 sigmoid(2u))
// LibTorch's CPU gelu(x, "tanh") spends most of its time in a slow tanh (on Debian's 1.13 it costs
// 3.6x the erf GELU, and was 11% of a kjv training step). The backward recomputes the sigmoid
// from the saved input.
torch::Tensor gelu_tanh(const torch::Tensor& x);

// Next-token cross-entropy summed over the rows whose target is not -1, differentiable in logits:
// logits (N, V), targets (N) int64 in [0, V) or -1. The forward keeps one log-sum-exp per row (not
// a (N, V) log-softmax), the backward writes softmax - one-hot in one pass. A target outside
// [0, V) and not -1 throws like LibTorch's ("Target 9 is out of bounds.").
torch::Tensor cross_entropy_sum(const torch::Tensor& logits, const torch::Tensor& targets);

// The same with the z-loss beside it (PaLM's, optim.z_loss): (2,) [the cross-entropy sum, z_loss x the
// sum of lse^2], lse = log sum_j exp(logits_j) of each row whose target is not -1; both entries
// differentiable (d/dlogits_j of the second: 2 z_loss lse softmax_j, in the same one pass). fp32
// (fp64 logits: fp64); anything but CPU float32 is LibTorch's cross-entropy and logsumexp.
// REQUIRES: z_loss > 0 (0 is cross_entropy_sum, whose gradient path it leaves untouched).
torch::Tensor cross_entropy_z_sum(const torch::Tensor& logits, const torch::Tensor& targets, double z_loss);

// Causal self-attention of packed heads, what GPT's fused qkv projection gives: qkv (B, T, 3C) as
// q | k | v, each C = n_head x hd wide -> y (B, T, C), heads side by side (the layout the output
// projection reads, so no transposes are copied). Per head: one sgemm for the scores, a causal
// softmax in place, one sgemm for y; the backward writes dq | dk | dv straight into one (B, T, 3C)
// gradient (no concatenation) with four sgemms per head. The attention weights (B*H, T, T) are
// kept for the backward, as LibTorch's softmax keeps them. Used on LibTorch 1.13 (2.x has SDPA),
// only without dropout. BLAS is the sgemm_ LibTorch itself calls, looked up in the process.
// doc_start (data.doc_mask): undefined, or (B, T) CPU int64, the first position of each position's
// document (models/lm.h's DocMask::start): each document is one block of its own, causal inside, and
// the products outside the documents' blocks are skipped (T^2 -> the sum of the documents' L^2).
bool causal_attention_qkv_applies(const torch::Tensor& qkv);  // CPU float32 (B, T, 3C) and BLAS found
torch::Tensor causal_attention_qkv(const torch::Tensor& qkv, int64_t n_head, const torch::Tensor& doc_start = {});

}  // namespace lm
