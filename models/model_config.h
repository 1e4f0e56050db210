// Configuration of the model architecture (YAML section `model:`). Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct ModelConfig {
  std::string arch = "gpt";     // model registry name; only "gpt" exists
  int64_t n_layer = 4;          // transformer blocks
  int64_t n_head = 4;           // attention heads; must divide d_model
  int64_t d_model = 256;        // residual width
  int64_t seq_len = 256;        // context length (learned positions)
  double dropout = 0.0;         // on embeddings, attention weights and residual branches
  int64_t vocab_size = 0;       // 0 = the data manifest's vocabulary
  int64_t vocab_multiple = 64;  // vocabulary padded up to a multiple of this
  double init_std = 0.02;       // std of normal init; residual projections get /sqrt(2*n_layer)
};

}  // namespace lm
