// The architectures, as facts that need no LibTorch: their names, the `model.*` keys each reads,
// the shape checks, and closed formulas for the parameter count and training FLOPs per token.
// With models/build.h (the modules) and models/hf.h (Hugging Face names) this is the one place
// that knows which architectures exist; the trainer, checkpoints, generation and MFU ask here.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/model_config.h"

namespace lm {

// "gpt" (GPT-2, models/gpt.h) and "llama" (Llama 2/3, models/llama.h).
const std::vector<std::string>& arch_names();
// Whether `arch` reads the key model.<leaf>.
bool arch_uses_key(const std::string& arch, const std::string& leaf);
// Shape checks beyond each key's own range; throws ConfigError "key 'model.X': ...".
void validate_model(const ModelConfig& c);

// vocab rounded up to a multiple of c.vocab_multiple (c.vocab_size when set, else data_vocab).
// Throws ConfigError when model.vocab_size is set below data_vocab.
int64_t padded_vocab(const ModelConfig& c, int64_t data_vocab);
// llama: key/value heads (n_kv_head, or n_head when 0).
int64_t kv_heads(const ModelConfig& c);
// llama: the SwiGLU hidden width as Meta's reference computes it: int(2 * 4d / 3), times
// ffn_dim_multiplier when set (int()), rounded up to a multiple of ffn_multiple_of.
int64_t ffn_hidden(const ModelConfig& c);

// Unique parameters of the module (a tied head counted once) for a padded vocabulary.
int64_t param_count(const ModelConfig& c, int64_t vocab);
// Activations saved for the backward pass per token and layer at context model.seq_len, in
// Korthikanti et al.'s 16-bit units (the memory check's estimate). gpt: 34d + 5HT (attention 11d +
// 5HT, MLP of 4d 19d, LayerNorms 4d). llama: attention 6d + 4 kv width (norm input to the
// projections, q, k, v, the output projection's input), the SwiGLU MLP 2d + 8F (input; w1, w3,
// silu and product of width F), RMSNorms 4d, scores 2HT (softmax, no dropout).
double saved_activations_per_token_layer(const ModelConfig& c);
// Training (forward + backward) matmul FLOPs per token at context length `context`, the MFU
// numerator: 6 x the weights a token multiplies through (matmul_params) + 12*L*d*context for QK^T
// and AV (PaLM appendix B, matmuls only: embedding lookups, norms, biases, activations and softmax
// are not counted).
double flops_per_token(const ModelConfig& c, int64_t vocab, int64_t context);
// The weights used as matmuls: every projection of every block and the LM head (V*d, tied or not);
// not the token/position embedding lookups (an untied input table is a lookup), norms or biases.
int64_t matmul_params(const ModelConfig& c, int64_t vocab);
// The formula above in words, for the log.
std::string flops_formula(const ModelConfig& c);

// The facts a checkpoint must match to be resumed by this config (name, value).
std::vector<std::pair<std::string, int64_t>> shape_facts(const ModelConfig& c);

}  // namespace lm
