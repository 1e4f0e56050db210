// GPT-2's activation, GELU with the tanh approximation, as one fused CPU kernel.
//
//   gelu(x) = 0.5 x (1 + tanh(u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
//           = x * sigmoid(2u)       (the same function: 1 + tanh(u) = 2 sigmoid(2u))
//
// Why: LibTorch's CPU gelu(x, "tanh") spends most of its time in a slow tanh (on Debian's 1.13 it
// is 3.6x the cost of the erf GELU, and 11% of a kjv training step). This kernel computes the
// sigmoid form with one exp per element (AVX2+FMA where the CPU has it), forward and backward in
// one pass each. It agrees with LibTorch's gelu(x, "tanh") within float rounding (a few ulp),
// not bit for bit; each element's result does not depend on how the tensor is split or threaded,
// so a run is reproducible at any thread count.
// Anything but a CPU float32 tensor (CUDA, bf16, fp64) goes to LibTorch's gelu(x, "tanh").
#pragma once

#include <torch/torch.h>

namespace lm {

// y = gelu_tanh(x), differentiable (the backward recomputes the sigmoid from the saved input).
torch::Tensor gelu_tanh(const torch::Tensor& x);

}  // namespace lm
