// Tokenizers: `bytes` (256 byte values + EOS + PAD) and `sentencepiece` (BPE or unigram models
// trained with, or loaded by, libsentencepiece). Thread-safe for concurrent encode/decode.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/format/manifest.h"

namespace lm::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<uint32_t> encode(const std::string& text) const = 0;
  // Special ids (EOS, PAD) and ids >= vocab_size decode to nothing.
  virtual std::string decode(const std::vector<uint32_t>& ids) const = 0;
  virtual const TokenizerInfo& info() const = 0;
};

// bytes: ids 0..255 are bytes, 256 = EOS, 257 = PAD, vocab 258.
std::unique_ptr<Tokenizer> make_bytes_tokenizer();
// Loads a sentencepiece .model file. Throws DataError naming the file, also when the model has no
// EOS or no PAD piece. info().file is the file's name, info().hash the xxh64 of its bytes.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path);
// The same from the model's serialized bytes; `origin` (a path) names it in errors and info().file.
std::unique_ptr<Tokenizer> sentencepiece_from_proto(const std::string& serialized, const std::string& origin);

// Training a sentencepiece model (prep --tokenizer sentencepiece).
struct SpTrainOptions {
  std::string type = "bpe";  // "bpe" or "unigram"
  uint64_t vocab_size = 0;   // REQUIRED: total pieces, specials and the 256 byte pieces included
};
// Trains on the documents `next_doc` yields (it returns false at the end; an exception it throws
// is rethrown here) and returns the serialized model. The model keeps text exactly (identity
// normalization, whitespace kept, byte fallback), so decode(encode(x)) == x for any UTF-8 text;
// ids: unk 0, eos 1, pad 2, no bos. Deterministic: the trainer runs single-threaded (its result
// depends on its thread count). Throws DataError naming --vocab-size when it does not fit the input.
std::string train_sentencepiece(const SpTrainOptions& opt, const std::function<bool(std::string&)>& next_doc);
// The tokenizer of a prepared dataset (DIR/manifest.json + its model file).
std::unique_ptr<Tokenizer> load_tokenizer(const Manifest& m);

// The same, for processes that also load LibTorch (generate, trainer). Debian's libsentencepiece
// bundles and exports its own protobuf, LibTorch links the system libprotobuf: in one symbol scope
// the dynamic linker mixes the two and the process crashes at start-up. So torch binaries never
// link libsentencepiece; this loads it from build/bin/lm_tokenizer.so (next to the executable)
// with dlopen(RTLD_LOCAL | RTLD_DEEPBIND). Throws DataError like load_tokenizer().
// `what`: a prepared dataset directory, "bytes", or a sentencepiece .model file (raw text sources).
std::unique_ptr<Tokenizer> load_tokenizer_isolated(const std::string& what);

}  // namespace lm::data
