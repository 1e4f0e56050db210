// The architectures' facts (see registry.h).
#include "models/registry.h"

#include <algorithm>

#include "common/errors.h"

namespace lm {
namespace {

// The model.* keys every architecture reads, and each one's own.
const std::vector<std::string> kCommonKeys = {"arch",       "n_layer",        "n_head",   "d_model", "seq_len",
                                              "vocab_size", "vocab_multiple", "init_std", "init_from"};
const std::vector<std::string> kGptKeys = {"dropout"};
const std::vector<std::string> kLlamaKeys = {"n_kv_head",       "norm_eps",           "rope_theta",
                                             "ffn_multiple_of", "ffn_dim_multiplier", "tie_embeddings"};

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

[[noreturn]] void bad_model_key(const std::string& key, const std::string& msg) {
  throw ConfigError("key 'model." + key + "': " + msg);
}

}  // namespace

const std::vector<std::string>& arch_names() {
  static const std::vector<std::string> names = {"gpt", "llama"};
  return names;
}

bool arch_uses_key(const std::string& arch, const std::string& leaf) {
  if (contains(kCommonKeys, leaf)) return true;
  if (arch == "gpt") return contains(kGptKeys, leaf);
  if (arch == "llama") return contains(kLlamaKeys, leaf);
  return false;
}

void validate_model(const ModelConfig& c) {
  if (!contains(arch_names(), c.arch)) bad_model_key("arch", "unknown architecture '" + c.arch + "'");
  if (c.d_model % c.n_head != 0)
    bad_model_key("d_model", std::to_string(c.d_model) + " is not divisible by model.n_head=" + std::to_string(c.n_head));
  if (c.arch != "llama") return;
  const int64_t kv = kv_heads(c);
  if (kv > c.n_head || c.n_head % kv != 0)
    bad_model_key("n_kv_head", std::to_string(kv) + " does not divide model.n_head=" + std::to_string(c.n_head));
  if ((c.d_model / c.n_head) % 2 != 0)
    bad_model_key("n_head", "RoPE needs an even head width, d_model/n_head = " + std::to_string(c.d_model / c.n_head));
}

int64_t padded_vocab(const ModelConfig& c, int64_t data_vocab) {
  if (c.vocab_size > 0 && c.vocab_size < data_vocab)
    bad_model_key("vocab_size", std::to_string(c.vocab_size) + " is smaller than the data's vocabulary (" +
                                    std::to_string(data_vocab) + ")");
  int64_t v = c.vocab_size > 0 ? c.vocab_size : data_vocab;
  return (v + c.vocab_multiple - 1) / c.vocab_multiple * c.vocab_multiple;
}

int64_t kv_heads(const ModelConfig& c) { return c.n_kv_head > 0 ? c.n_kv_head : c.n_head; }

int64_t ffn_hidden(const ModelConfig& c) {
  int64_t h = 2 * (4 * c.d_model) / 3;
  if (c.ffn_dim_multiplier > 0) h = static_cast<int64_t>(c.ffn_dim_multiplier * static_cast<double>(h));
  return c.ffn_multiple_of * ((h + c.ffn_multiple_of - 1) / c.ffn_multiple_of);
}

int64_t param_count(const ModelConfig& c, int64_t vocab) {
  const int64_t d = c.d_model, L = c.n_layer;
  if (c.arch == "gpt")  // wte + wpe + L x (2 LayerNorms, qkv, proj, fc, fc2 with biases) + final LayerNorm
    return vocab * d + c.seq_len * d + L * (12 * d * d + 13 * d) + 2 * d;
  const int64_t kv = kv_heads(c) * (d / c.n_head), h = ffn_hidden(c);
  const int64_t block = 2 * d * d + 2 * d * kv + 3 * d * h + 2 * d;  // wq wo, wk wv, w1 w2 w3, 2 RMSNorms
  return vocab * d * (c.tie_embeddings ? 1 : 2) + L * block + d;
}

int64_t matmul_params(const ModelConfig& c, int64_t vocab) {
  const int64_t d = c.d_model, L = c.n_layer;
  if (c.arch == "gpt") return L * 12 * d * d + vocab * d;  // qkv, proj, fc, fc2; the tied head
  const int64_t kv = kv_heads(c) * (d / c.n_head), h = ffn_hidden(c);
  return L * (2 * d * d + 2 * d * kv + 3 * d * h) + vocab * d;  // wq wo, wk wv, w1 w2 w3; the head
}

double saved_activations_per_token_layer(const ModelConfig& c) {
  const double d = static_cast<double>(c.d_model), H = static_cast<double>(c.n_head), T = static_cast<double>(c.seq_len);
  if (c.arch == "gpt") return 34 * d + 5 * H * T;
  const double kv = static_cast<double>(kv_heads(c) * (c.d_model / c.n_head)), F = static_cast<double>(ffn_hidden(c));
  return 12 * d + 4 * kv + 8 * F + 2 * H * T;
}

double flops_per_token(const ModelConfig& c, int64_t vocab, int64_t context) {
  return 6.0 * static_cast<double>(matmul_params(c, vocab)) +
         12.0 * static_cast<double>(c.n_layer * c.d_model) * static_cast<double>(context);
}

std::string flops_formula(const ModelConfig&) { return "6*(matmul weights incl. the LM head) + 12*L*d*T, matmuls only"; }

std::vector<std::pair<std::string, int64_t>> shape_facts(const ModelConfig& c) {
  std::vector<std::pair<std::string, int64_t>> f = {
      {"n_layer", c.n_layer}, {"n_head", c.n_head}, {"d_model", c.d_model}, {"seq_len", c.seq_len}};
  if (c.arch == "llama") {
    f.push_back({"n_kv_head", kv_heads(c)});
    f.push_back({"ffn_hidden", ffn_hidden(c)});
    f.push_back({"tie_embeddings", c.tie_embeddings ? 1 : 0});
  }
  return f;
}

}  // namespace lm
