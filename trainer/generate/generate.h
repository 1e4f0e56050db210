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
  // A model trained with data.doc_mask: this EOS id ends a document, and the context is the last
  // token's document alone (from the token after the last EOS before it, positions from 0), what
  // the model saw in training; a new document after a generated EOS starts a fresh context. -1 = the
  // whole context, across EOS tokens.
  int64_t doc_eos = -1;
};

// Appends max_new_tokens sampled tokens to `prompt` (which must not be empty) and returns all of
// them. The context is cropped to the model's seq_len. Draws from the default generator. With and
// without kv_cache the tokens are the same (the same context, attended the same way). With
// doc_eos, the prompt's documents before its last one are not seen.
std::vector<int64_t> generate(LM& model, std::vector<int64_t> prompt, const SampleOptions& opt);

}  // namespace lm
