// Configuration of the model architecture (YAML section `model:`). Torch-free. Which keys each
// architecture reads is said once, in models/registry.cpp; a key set for an architecture that does
// not read it is refused by the config parser.
// The keys' descriptions and allowed values are in describe_model (model_config.cpp); `trainer --keys`
// prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>

namespace lm {
namespace config_schema {
class Schema;
}

struct ModelConfig {
  std::string arch = "gpt";
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t d_model = 256;
  int64_t seq_len = 256;
  int64_t vocab_size = 0;
  int64_t vocab_multiple = 64;
  double init_std = 0.02;
  std::string init_from;
  // gpt only
  double dropout = 0.0;
  // llama only
  int64_t n_kv_head = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  int64_t ffn_multiple_of = 256;
  double ffn_dim_multiplier = 0.0;
  bool tie_embeddings = false;
};

// The model.* keys into the config schema (run/config/config.cpp's describe()).
void describe_model(config_schema::Schema& s, ModelConfig& m);

}  // namespace lm
