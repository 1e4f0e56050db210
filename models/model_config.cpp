// The model: section's keys (see model_config.h): each one's type, allowed values and its one
// description, printed by `trainer --keys` and docs/config.md. Torch-free (lm_models_spec).
#include "models/model_config.h"

#include "common/config/schema.h"
#include "models/registry.h"

namespace lm {

void describe_model(config_schema::Schema& s, ModelConfig& m) {
  s.choice("model.arch", &m.arch, "model architecture (models/registry.h)", arch_names());
  s.integer("model.n_layer", &m.n_layer, "transformer blocks", 1, 1024);
  s.integer("model.n_head", &m.n_head, "attention heads; must divide model.d_model", 1, 1024);
  s.integer("model.d_model", &m.d_model, "residual width", 1, 1 << 16);
  s.integer("model.seq_len", &m.seq_len, "context length in tokens (gpt: learned positions; llama: the RoPE table)",
            1, 1 << 20);
  s.number("model.dropout", &m.dropout, "gpt: dropout probability on embeddings, attention weights and residual "
           "branches", 0, false, 1, true);
  s.integer("model.vocab_size", &m.vocab_size, "vocabulary size; 0 = the data manifest's vocabulary", 0);
  s.integer("model.vocab_multiple", &m.vocab_multiple, "vocabulary padded up to a multiple of this", 1);
  s.number("model.init_std", &m.init_std, "std of the normal weight init (see each architecture's init_weights)", 0, true);
  s.text("model.init_from", &m.init_from, "Hugging Face directory (model.safetensors) to start from; empty = fresh init",
         "path or empty");
  s.integer("model.n_kv_head", &m.n_kv_head, "llama: key/value heads (grouped-query attention); 0 = model.n_head", 0, 1024);
  s.number("model.norm_eps", &m.norm_eps, "llama: RMSNorm epsilon", 0, true);
  s.number("model.rope_theta", &m.rope_theta, "llama: RoPE base", 0, true);
  s.integer("model.ffn_multiple_of", &m.ffn_multiple_of, "llama: SwiGLU hidden width rounded up to a multiple of this", 1);
  s.number("model.ffn_dim_multiplier", &m.ffn_dim_multiplier, "llama: SwiGLU hidden width multiplier; 0 = none (Llama's "
           "None)", 0, false);
  s.boolean("model.tie_embeddings", &m.tie_embeddings, "llama: the output head shares the token embedding");
}

}  // namespace lm
