// Hugging Face names and layouts of each architecture's tensors, and the config.json that
// transformers reads (LlamaConfig / GPT2Config). Pure relabelling: to_hf then from_hf gives back
// the same tensors bit for bit.
//
// gpt -> GPT2LMHeadModel: "transformer.wte.weight", "transformer.h.0.attn.c_attn.weight", ...;
//   HF GPT-2's Conv1D stores weights as (in, out), so every Linear weight is transposed; the head
//   is tied (no lm_head.weight).
// llama -> LlamaForCausalLM: "model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
//   "model.layers.0.mlp.gate_proj.weight" (= w1; up_proj = w3, down_proj = w2), "model.norm.weight",
//   "lm_head.weight" (absent when tied). Our RoPE rotates interleaved pairs (2i, 2i+1) as Meta's
//   reference; HF's rotate_half pairs i with i + hd/2. As Meta's convert_llama_weights_to_hf.py,
//   the rows of q_proj / k_proj are permuted within each head (pair members first, then second
//   members), which makes HF's convention compute exactly our attention.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>
#include <utility>
#include <vector>

#include "models/model_config.h"

namespace lm {

using TensorPairs = std::vector<std::pair<std::string, torch::Tensor>>;

// "gpt2" / "llama": config.json's model_type for c.arch.
std::string hf_model_type(const std::string& arch);
// Our tensors (any order; names as the module's) -> HF names and layout. Throws std::out_of_range
// naming a tensor the architecture does not have.
TensorPairs to_hf(const ModelConfig& c, const TensorPairs& ours);
// HF names and layout -> ours; the same check.
TensorPairs from_hf(const ModelConfig& c, const TensorPairs& hf);
// config.json for a padded vocabulary; eos_id/pad_id from the tokenizer.
nlohmann::json hf_config(const ModelConfig& c, int64_t vocab, int64_t eos_id, int64_t pad_id);
// "" when `file` (a config.json of c's model_type) describes the model that c and `vocab` build,
// else why, naming the first field that differs, the file's value and the config's:
// "num_attention_heads is 8, the config gives 4 (model.n_head)". Every field that changes the math
// is compared, a field the file omits as transformers reads it (its default): gpt2: vocab_size,
// n_embd, n_layer, n_head, n_positions, n_inner, activation_function, layer_norm_epsilon,
// tie_word_embeddings, scale_attn_weights, scale_attn_by_inverse_layer_idx; llama: vocab_size,
// hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads,
// head_dim, rms_norm_eps, rope_theta, rope_scaling, hidden_act, attention_bias, mlp_bias,
// tie_word_embeddings. Not compared: llama's max_position_embeddings (the length of RoPE's table
// only: a position below both computes the same), dropouts, token ids, initializer_range.
std::string hf_config_mismatch(const ModelConfig& c, int64_t vocab, const nlohmann::json& file);

}  // namespace lm
