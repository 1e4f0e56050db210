// Hugging Face names and layouts (see hf.h).
#include "models/hf.h"

#include <algorithm>
#include <cmath>
#include <functional>
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

namespace {

// A config.json field that changes the math: our value, what transformers reads when a file omits
// it (computed from the file: some defaults follow other fields), and values that compute the
// same as ours.
struct MathField {
  std::string name;
  nlohmann::json ours;
  std::function<nlohmann::json(const nlohmann::json& file)> absent;
  std::string key;  // the model key(s) our value comes from
  std::vector<nlohmann::json> same = {};
};

std::function<nlohmann::json(const nlohmann::json&)> hf_default(nlohmann::json v) {
  return [v](const nlohmann::json&) { return v; };
}

std::vector<MathField> math_fields(const ModelConfig& c, int64_t vocab) {
  const int64_t d = c.d_model;
  if (c.arch == "gpt")  // GPT2Config's defaults
    return {{"vocab_size", vocab, hf_default(50257), "the padded vocabulary: model.vocab_size / data, model.vocab_multiple"},
            {"n_embd", d, hf_default(768), "model.d_model"},
            {"n_layer", c.n_layer, hf_default(12), "model.n_layer"},
            {"n_head", c.n_head, hf_default(12), "model.n_head"},
            {"n_positions", c.seq_len, hf_default(1024), "model.seq_len"},
            {"n_inner", nullptr, hf_default(nullptr), "4 x model.d_model", {4 * d}},
            {"activation_function", "gelu_new", hf_default("gelu_new"), "GELU, tanh approximation", {"gelu_pytorch_tanh"}},
            {"layer_norm_epsilon", 1e-5, hf_default(1e-5), "LayerNorm's eps"},
            {"tie_word_embeddings", true, hf_default(true), "gpt's tied head"},
            {"scale_attn_weights", true, hf_default(true), "attention scaled by 1/sqrt(head width)"},
            {"scale_attn_by_inverse_layer_idx", false, hf_default(false), "attention scaled by 1/sqrt(head width)"}};
  auto heads = [](const nlohmann::json& f) { return f.value("num_attention_heads", nlohmann::json(32)); };
  return {{"vocab_size", vocab, hf_default(32000), "the padded vocabulary: model.vocab_size / data, model.vocab_multiple"},
          {"hidden_size", d, hf_default(4096), "model.d_model"},
          {"intermediate_size", ffn_hidden(c), hf_default(11008), "model.ffn_multiple_of, model.ffn_dim_multiplier"},
          {"num_hidden_layers", c.n_layer, hf_default(32), "model.n_layer"},
          {"num_attention_heads", c.n_head, hf_default(32), "model.n_head"},
          {"num_key_value_heads", kv_heads(c), heads, "model.n_kv_head"},
          {"head_dim", d / c.n_head,
           [heads](const nlohmann::json& f) {
             const auto h = heads(f), w = f.value("hidden_size", nlohmann::json(4096));
             if (!h.is_number_integer() || !w.is_number_integer() || h.get<int64_t>() <= 0) return nlohmann::json();
             return nlohmann::json(w.get<int64_t>() / h.get<int64_t>());
           },
           "model.d_model / model.n_head"},
          {"rms_norm_eps", c.norm_eps, hf_default(1e-6), "model.norm_eps"},
          {"rope_theta", c.rope_theta, hf_default(10000.0), "model.rope_theta"},
          {"rope_scaling", nullptr, hf_default(nullptr), "llama's RoPE has no scaling"},
          {"hidden_act", "silu", hf_default("silu"), "llama's SwiGLU"},
          {"attention_bias", false, hf_default(false), "llama has no biases"},
          {"mlp_bias", false, hf_default(false), "llama has no biases"},
          {"tie_word_embeddings", c.tie_embeddings, hf_default(false), "model.tie_embeddings"}};
}

bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number() && !a.is_boolean() && !b.is_boolean()) {
    const double x = a.get<double>(), y = b.get<double>();
    return x == y || std::abs(x - y) <= 1e-12 * std::max(std::abs(x), std::abs(y));
  }
  return a == b;
}

}  // namespace

nlohmann::json hf_config(const ModelConfig& c, int64_t vocab, int64_t eos_id, int64_t pad_id) {
  nlohmann::json j = {{"model_type", hf_model_type(c.arch)}, {"bos_token_id", eos_id}, {"eos_token_id", eos_id},
                      {"pad_token_id", pad_id}, {"torch_dtype", "float32"}, {"initializer_range", c.init_std}};
  for (const auto& f : math_fields(c, vocab)) j[f.name] = f.ours;
  if (c.arch == "gpt") {
    j["architectures"] = {"GPT2LMHeadModel"};
    j.update({{"n_ctx", c.seq_len}, {"resid_pdrop", c.dropout}, {"embd_pdrop", c.dropout}, {"attn_pdrop", c.dropout}});
    return j;
  }
  j["architectures"] = {"LlamaForCausalLM"};
  j.update({{"max_position_embeddings", c.seq_len}, {"attention_dropout", 0.0}});
  return j;
}

std::string hf_config_mismatch(const ModelConfig& c, int64_t vocab, const nlohmann::json& file) {
  for (const auto& f : math_fields(c, vocab)) {
    const bool has = file.contains(f.name);
    const nlohmann::json v = has ? file[f.name] : f.absent(file);
    bool ok = same_value(v, f.ours);
    for (const auto& s : f.same) ok = ok || same_value(v, s);
    if (!ok)
      return f.name + " is " + (has ? v.dump() : "absent (transformers reads " + v.dump() + ")") + ", the config gives " +
             f.ours.dump() + " (" + f.key + ")";
  }
  return "";
}

}  // namespace lm
