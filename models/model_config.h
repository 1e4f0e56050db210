// Configuration of the model architecture (YAML section `model:`). Torch-free. Which keys each
// architecture reads is said once, in models/registry.cpp; a key set for an architecture that does
// not read it is refused by the config parser.
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct ModelConfig {
  std::string arch = "gpt";     // architecture: gpt | llama (models/registry.h)
  int64_t n_layer = 4;          // transformer blocks
  int64_t n_head = 4;           // attention heads; must divide d_model
  int64_t d_model = 256;        // residual width
  int64_t seq_len = 256;        // context length (gpt: learned positions; llama: RoPE table)
  int64_t vocab_size = 0;       // 0 = the data manifest's vocabulary
  int64_t vocab_multiple = 64;  // vocabulary padded up to a multiple of this
  double init_std = 0.02;       // std of normal init (see each architecture's init_weights)
  std::string init_from;        // "" or a Hugging Face directory (model.safetensors) to start from
  // gpt only
  double dropout = 0.0;         // on embeddings, attention weights and residual branches
  // llama only
  int64_t n_kv_head = 0;            // key/value heads (grouped-query attention); 0 = n_head
  double norm_eps = 1e-5;           // RMSNorm epsilon
  double rope_theta = 10000.0;      // RoPE base
  int64_t ffn_multiple_of = 256;    // SwiGLU hidden width rounded up to a multiple of this
  double ffn_dim_multiplier = 0.0;  // hidden width multiplier; 0 = none (Llama's None)
  bool tie_embeddings = false;      // output head shares the token embedding
};

}  // namespace lm
