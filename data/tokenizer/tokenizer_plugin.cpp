// The tokenizer plugin (build/bin/lm_tokenizer.so): load_tokenizer() behind a C entry point, for
// processes that also load LibTorch. See load_tokenizer_isolated() in tokenizer.h for why.
#include <cstring>
#include <exception>

#include "data/format/manifest.h"
#include "data/tokenizer/tokenizer.h"

// Returns the tokenizer of the dataset in `dir`, or nullptr with a message in err[0..n).
extern "C" __attribute__((visibility("default"))) lm::data::Tokenizer* lm_tokenizer_load(
    const char* dir, char* err, size_t n) {
  try {
    return lm::data::load_tokenizer(lm::data::Manifest::load(dir)).release();
  } catch (const std::exception& e) {
    std::strncpy(err, e.what(), n - 1);
    err[n - 1] = '\0';
    return nullptr;
  }
}
