// The LM head and the cross-entropy as one differentiable function (train.fused_loss), built from
// ATen ops: the logits are never cast to fp32 and never kept. Today's path (lm.cpp) casts the
// (N, V) logits to fp32 and its loss reads and writes them several times each way (GPT-2 124M, batch
// 16 x 1024: 3.3 GB of fp32 logits, ~30 GB of traffic per step); this one makes one (N, V) tensor in
// the compute dtype, the softmax, keeps it, and writes the gradient into it in place (~5 GB).
#pragma once

#include <torch/torch.h>

namespace lm {

// hidden (N, C), weight (V, C) (the head: logits = hidden weight^T), targets (N) int64 in [0, V) or
// -1 (ignored) -> the cross-entropy SUMMED over the rows whose target is not -1: a 0-dim float32,
// differentiable in hidden and weight (gradients in their own dtypes; a tied head's gradient adds to
// the embedding's as usual).
// Compute dtype: autocast's dtype where autocast is on for hidden's device (the inputs are cast
// explicitly; autocast is off inside), else the promoted dtype of hidden and weight. The softmax
// accumulates in fp32 and is stored in the compute dtype; a row's loss is -log(p_t) for p_t <= 0.5,
// else -log1p(-rest), rest the fp32 sum of the row's other probabilities (no cancellation when p_t
// is near 1), and the target's gradient p_t - 1 is taken from the same split (-rest near 1).
// Limits: a target whose probability underflows (a per-token loss above ~87 nats, fp32 and bf16
// alike) counts as -log(FLT_MIN) = 87.3 in the loss; its gradient is exact. The backward runs once
// (it overwrites the saved softmax; a second backward throws LibTorch's in-place error).
// REQUIRES: every target < V (not checked on the device, as it would cost a sync).
torch::Tensor fused_head_loss_sum(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets);

// The same with the z-loss beside it (optim.z_loss): (2,) float32 [the cross-entropy sum, z_loss x the
// sum over the valid rows of lse^2], lse = log sum_j exp(logit_j), both differentiable. lse is
// computed in fp32 from the compute-dtype logits, a block of rows at a time (a transient fp32
// temporary of at most 64 MB), before the softmax overwrites them; the backward scales the saved
// softmax in place by g + g_z 2 z_loss lse (one more pass over it). REQUIRES: z_loss > 0 (0 is
// fused_head_loss_sum, whose gradient path it leaves untouched).
torch::Tensor fused_head_loss_z_sum(const torch::Tensor& hidden, const torch::Tensor& weight, const torch::Tensor& targets,
                                    double z_loss);

}  // namespace lm
