// The tokenizer plugin (build/bin/lm_tokenizer.so): load_tokenizer() behind a C entry point, for
// processes that also load LibTorch. See load_tokenizer_isolated() in tokenizer.h for why.
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>

#include "data/format/manifest.h"
#include "data/tokenizer/tokenizer.h"

// Returns the tokenizer `what` names ("bytes", a sentencepiece .model file, or a prepared dataset
// directory: its tokenizer), or nullptr with a message in err[0..n).
extern "C" __attribute__((visibility("default"))) lm::data::Tokenizer* lm_tokenizer_load(
    const char* what, char* err, size_t n) {
  try {
    const std::string w = what;
    if (w == "bytes") return lm::data::make_bytes_tokenizer().release();
    if (std::filesystem::is_regular_file(w)) return lm::data::load_sentencepiece(w).release();
    return lm::data::load_tokenizer(lm::data::Manifest::load(w)).release();
  } catch (const std::exception& e) {
    std::strncpy(err, e.what(), n - 1);
    err[n - 1] = '\0';
    return nullptr;
  }
}
