// Activation recomputation ("activation checkpointing") of one transformer block (train.activation_checkpointing=block): the
// block's activations are not kept for the backward; it is run again there. LibTorch's C++ API has
// no torch.utils.checkpoint; this is its reentrant form as one autograd function.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace lm {

// y = block(x) for x (B, T, C), keeping only x for the backward (one (B, T, C) tensor instead of the
// block's activations): block runs under NoGradGuard, and the backward runs block(x) again with grad
// enabled and backpropagates through it, returning x's gradient and the parameters' gradients,
// which autograd accumulates into their .grad as it does without checkpointing (their
// AccumulateGrad nodes run, post-hooks and all: trainer/parallel/grad_sync.cpp).
// The rerun computes the same bits as the first run: it starts from the default generators' states
// of the first run (CPU; and x's CUDA device), set for the rerun and restored after it to their
// states when the backward began (later draws are unaffected), and under the autocast state
// (per device on/off and dtype) of the first run; autocast's cast cache is neither read nor filled
// by either run (a cast made under no-grad and cached would give the rerun a weight copy without a
// gradient path).
// REQUIRES: block is a function of x, `params` and the default generators only, and chooses the
// same kernels with and without grad (LibTorch's CPU kernels do; SDPA's choice on CUDA may depend on
// requires_grad for head widths above 192 on sm86/sm89); `params`: every tensor requiring grad that
// block reads besides x (the block's parameters). The block (and what it captures) is kept by the
// graph until the backward has run.
torch::Tensor recompute_block(std::function<torch::Tensor(const torch::Tensor&)> block, const torch::Tensor& x,
                               const std::vector<torch::Tensor>& params);

}  // namespace lm
