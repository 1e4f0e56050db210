// Hugging Face names and layouts (see hf.h).
#include "models/hf.h"

#include <map>
#include <stdexcept>

#include "models/registry.h"

namespace lm {
namespace {

enum class Layout { kSame, kTransposed, kRopeQ, kRopeK };

struct HfName {
  std::string hf;
  Layout layout;
};

// Our name -> HF name and layout, for every tensor of c's module.
std::map<std::string, HfName> hf_names(const ModelConfig& c) {
  std::map<std::string, HfName> m;
  const auto S = Layout::kSame, T = Layout::kTransposed;
  if (c.arch == "gpt") {
    m["wte.weight"] = {"transformer.wte.weight", S};
    m["wpe.weight"] = {"transformer.wpe.weight", S};
    m["lnf.weight"] = {"transformer.ln_f.weight", S};
    m["lnf.bias"] = {"transformer.ln_f.bias", S};
    const std::vector<std::pair<std::string, std::string>> parts = {
        {"ln1", "ln_1"}, {"qkv", "attn.c_attn"}, {"proj", "attn.c_proj"}, {"ln2", "ln_2"}, {"fc", "mlp.c_fc"}, {"fc2", "mlp.c_proj"}};
    for (int64_t i = 0; i < c.n_layer; ++i) {
      const std::string ours = "blocks." + std::to_string(i) + ".", hf = "transformer.h." + std::to_string(i) + ".";
      for (const auto& [o, h] : parts) {
        const bool linear = o != "ln1" && o != "ln2";
        m[ours + o + ".weight"] = {hf + h + ".weight", linear ? T : S};
        m[ours + o + ".bias"] = {hf + h + ".bias", S};
      }
    }
    return m;
  }
  m["tok_embeddings.weight"] = {"model.embed_tokens.weight", S};
  m["norm.weight"] = {"model.norm.weight", S};
  if (!c.tie_embeddings) m["output.weight"] = {"lm_head.weight", S};
  const std::vector<std::tuple<std::string, std::string, Layout>> parts = {
      {"attention.wq", "self_attn.q_proj", Layout::kRopeQ}, {"attention.wk", "self_attn.k_proj", Layout::kRopeK},
      {"attention.wv", "self_attn.v_proj", S},             {"attention.wo", "self_attn.o_proj", S},
      {"feed_forward.w1", "mlp.gate_proj", S},             {"feed_forward.w2", "mlp.down_proj", S},
      {"feed_forward.w3", "mlp.up_proj", S},               {"attention_norm", "input_layernorm", S},
      {"ffn_norm", "post_attention_layernorm", S}};
  for (int64_t i = 0; i < c.n_layer; ++i)
    for (const auto& [o, h, layout] : parts)
      m["layers." + std::to_string(i) + "." + o + ".weight"] = {"model.layers." + std::to_string(i) + "." + h + ".weight", layout};
  return m;
}

// Rows (heads x hd, in) of q or k: interleaved pairs -> halves (to_hf) or back.
torch::Tensor rope_permute(const torch::Tensor& w, int64_t heads, bool to_hf) {
  const int64_t rows = w.size(0), cols = w.size(1), half = rows / heads / 2;
  auto v = to_hf ? w.reshape({heads, half, 2, cols}) : w.reshape({heads, 2, half, cols});
  return v.transpose(1, 2).reshape({rows, cols}).contiguous();
}

torch::Tensor relayout(const ModelConfig& c, const torch::Tensor& t, Layout layout, bool to_hf) {
  switch (layout) {
    case Layout::kTransposed: return t.t().contiguous();
    case Layout::kRopeQ: return rope_permute(t, c.n_head, to_hf);
    case Layout::kRopeK: return rope_permute(t, kv_heads(c), to_hf);
    default: return t;
  }
}

}  // namespace

std::string hf_model_type(const std::string& arch) { return arch == "gpt" ? "gpt2" : arch; }

TensorPairs to_hf(const ModelConfig& c, const TensorPairs& ours) {
  const auto names = hf_names(c);
  TensorPairs out;
  for (const auto& [name, t] : ours) {
    auto it = names.find(name);
    if (it == names.end()) throw std::out_of_range("model." + c.arch + " has no tensor '" + name + "'");
    out.emplace_back(it->second.hf, relayout(c, t, it->second.layout, true));
  }
  return out;
}

TensorPairs from_hf(const ModelConfig& c, const TensorPairs& hf) {
  std::map<std::string, std::pair<std::string, Layout>> back;
  for (const auto& [ours, h] : hf_names(c)) back[h.hf] = {ours, h.layout};
  TensorPairs out;
  for (const auto& [name, t] : hf) {
    auto it = back.find(name);
    if (it == back.end()) throw std::out_of_range(hf_model_type(c.arch) + " has no tensor '" + name + "' here");
    out.emplace_back(it->second.first, relayout(c, t, it->second.second, false));
  }
  return out;
}

nlohmann::json hf_config(const ModelConfig& c, int64_t vocab, int64_t eos_id, int64_t pad_id) {
  nlohmann::json j = {{"model_type", hf_model_type(c.arch)}, {"vocab_size", vocab}, {"bos_token_id", eos_id},
                      {"eos_token_id", eos_id}, {"pad_token_id", pad_id}, {"torch_dtype", "float32"},
                      {"initializer_range", c.init_std}};
  if (c.arch == "gpt") {
    j["architectures"] = {"GPT2LMHeadModel"};
    j.update({{"n_embd", c.d_model}, {"n_layer", c.n_layer}, {"n_head", c.n_head}, {"n_positions", c.seq_len},
              {"n_ctx", c.seq_len}, {"n_inner", nullptr}, {"activation_function", "gelu_new"},
              {"layer_norm_epsilon", 1e-5}, {"resid_pdrop", c.dropout}, {"embd_pdrop", c.dropout},
              {"attn_pdrop", c.dropout}, {"tie_word_embeddings", true}});
    return j;
  }
  j["architectures"] = {"LlamaForCausalLM"};
  j.update({{"hidden_size", c.d_model}, {"intermediate_size", ffn_hidden(c)}, {"num_hidden_layers", c.n_layer},
            {"num_attention_heads", c.n_head}, {"num_key_value_heads", kv_heads(c)}, {"head_dim", c.d_model / c.n_head},
            {"max_position_embeddings", c.seq_len}, {"rms_norm_eps", c.norm_eps}, {"rope_theta", c.rope_theta},
            {"rope_scaling", nullptr}, {"hidden_act", "silu"}, {"attention_bias", false}, {"mlp_bias", false},
            {"attention_dropout", 0.0}, {"tie_word_embeddings", c.tie_embeddings}});
  return j;
}

}  // namespace lm
