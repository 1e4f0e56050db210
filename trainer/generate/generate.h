// Text generation from a trained model: temperature and top-k sampling.
#pragma once

#include <cstdint>
#include <vector>

#include "models/lm.h"

namespace lm {

struct SampleOptions {
  int64_t max_new_tokens = 200;  // tokens to append
  double temperature = 0.8;      // 1 = the model's distribution; 0 = greedy (the most likely token)
  int64_t top_k = 40;            // sample among the k most likely; 0 = all
  int64_t vocab_limit = 0;       // ids >= this are never sampled (vocab padding); 0 = no limit
  bool kv_cache = true;          // feed only new positions (O(N) positions for N tokens within seq_len)
};

// Appends max_new_tokens sampled tokens to `prompt` (which must not be empty) and returns all of
// them. The context is cropped to the model's seq_len. Draws from the default generator. With and
// without kv_cache the tokens are the same (the same context, attended the same way).
std::vector<int64_t> generate(LM& model, std::vector<int64_t> prompt, const SampleOptions& opt);

}  // namespace lm
