// The bytes and sentencepiece tokenizers, sentencepiece training, and loading a dataset's tokenizer
// (see tokenizer.h).
#include "data/tokenizer/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <exception>
#include <filesystem>
#include <unordered_map>

#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"

namespace lm::data {
namespace {

namespace sp = sentencepiece;

// sentencepiece's status type and its codes: sentencepiece::util's own up to 0.2.0 (Debian bookworm,
// trixie), Abseil's in 0.2.2 (Debian sid; LM_SENTENCEPIECE_ABSL, a feature test in CMakeLists.txt),
// whose inputs are absl::Span (the std::vector overloads are deprecated there). Either status's
// message() (const char* or string_view) makes a std::string.
#ifdef LM_SENTENCEPIECE_ABSL
using SpStatus = absl::Status;
using SpCode = absl::StatusCode;
template <class T>
absl::Span<const T> sp_input(const std::vector<T>& v) {
  return absl::MakeConstSpan(v);
}
#else
using SpStatus = sp::util::Status;
using SpCode = sp::util::StatusCode;
template <class T>
const std::vector<T>& sp_input(const std::vector<T>& v) {
  return v;
}
#endif

// "./src/x.cc(580) [expr] Message." -> "Message."
std::string strip_check_prefix(const std::string& msg) {
  auto at = msg.find("] ");
  return msg.rfind("./src/", 0) == 0 && at != std::string::npos ? msg.substr(at + 2) : msg;
}

class BytesTokenizer : public Tokenizer {
 public:
  BytesTokenizer() {
    info_.kind = "bytes";
    info_.vocab_size = 258;
    info_.eos_id = 256;
    info_.pad_id = 257;
    info_.hash = hex64(xxh64("bytes", 5));
  }
  std::vector<uint32_t> encode(const std::string& text) const override {
    return std::vector<uint32_t>(reinterpret_cast<const uint8_t*>(text.data()),
                                 reinterpret_cast<const uint8_t*>(text.data()) + text.size());
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (uint32_t id : ids)
      if (id < 256) out += static_cast<char>(id);
    return out;
  }
  const TokenizerInfo& info() const override { return info_; }

 private:
  TokenizerInfo info_;
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(const std::string& serialized, const std::string& origin) {
    auto st = sp_.LoadFromSerializedProto(serialized);
    if (!st.ok()) {
      const std::string why = strip_check_prefix(std::string(st.message()));
      throw DataError(origin + ": not a sentencepiece model" + (why.empty() ? "" : " (" + why + ")"));
    }
    if (sp_.eos_id() < 0) throw DataError(origin + ": sentencepiece model has no EOS piece");
    if (sp_.pad_id() < 0) throw DataError(origin + ": sentencepiece model has no PAD piece (train it with pad_id set)");
    info_.kind = "sentencepiece";
    info_.vocab_size = static_cast<uint64_t>(sp_.GetPieceSize());
    info_.eos_id = static_cast<uint32_t>(sp_.eos_id());
    info_.pad_id = static_cast<uint32_t>(sp_.pad_id());
    info_.file = std::filesystem::path(origin).filename().string();
    info_.hash = hex64(xxh64(serialized.data(), serialized.size()));
  }
  std::vector<uint32_t> encode(const std::string& text) const override {
    std::vector<int> ids;
    auto st = sp_.Encode(text, &ids);
    if (!st.ok()) throw Error("sentencepiece encode failed: " + std::string(st.message()));
    return std::vector<uint32_t>(ids.begin(), ids.end());
  }
  std::string decode(const std::vector<uint32_t>& ids) const override {
    std::vector<int> keep;
    keep.reserve(ids.size());
    for (uint32_t id : ids)
      if (id < info_.vocab_size && !sp_.IsControl(static_cast<int>(id))) keep.push_back(static_cast<int>(id));
    std::string out;
    auto st = sp_.Decode(sp_input(keep), &out);
    if (!st.ok()) throw Error("sentencepiece decode failed: " + std::string(st.message()));
    return out;
  }
  const TokenizerInfo& info() const override { return info_; }

 private:
  sp::SentencePieceProcessor sp_;
  TokenizerInfo info_;
};

// Feeds prep's documents to the trainer; an exception from the source ends the iteration and is
// kept for rethrowing after Train() returns (it must not unwind through sentencepiece).
class DocIterator : public sp::SentenceIterator {
 public:
  explicit DocIterator(const std::function<bool(std::string&)>& next) : next_(next) { Next(); }
  bool done() const override { return done_; }
  void Next() override {
    try {
      done_ = !next_(doc_);
    } catch (...) {
      error_ = std::current_exception();
      done_ = true;
    }
  }
  const std::string& value() const override { return doc_; }
  SpStatus status() const override {
    return error_ ? SpStatus(SpCode::kAborted, "document source failed") : SpStatus();
  }
  std::exception_ptr error() const { return error_; }

 private:
  const std::function<bool(std::string&)>& next_;
  std::string doc_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_bytes_tokenizer() { return std::make_unique<BytesTokenizer>(); }

std::unique_ptr<Tokenizer> sentencepiece_from_proto(const std::string& serialized, const std::string& origin) {
  return std::make_unique<SentencePieceTokenizer>(serialized, origin);
}

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& model_path) {
  return sentencepiece_from_proto(files::read_file(model_path), model_path);
}

std::unique_ptr<Tokenizer> load_tokenizer(const Manifest& m) {
  const std::string where = m.dir + "/manifest.json";
  std::unique_ptr<Tokenizer> t;
  if (m.tokenizer.kind == "bytes") {
    t = make_bytes_tokenizer();
  } else if (m.tokenizer.kind == "sentencepiece") {
    const std::string path = m.dir + "/" + m.tokenizer.file;
    t = load_sentencepiece(path);
    if (t->info().hash != m.tokenizer.hash)
      throw DataError(path + ": xxh64 " + t->info().hash + " does not match " + where + " (" + m.tokenizer.hash + ")");
  } else {
    throw DataError(where + ": unknown tokenizer kind '" + m.tokenizer.kind + "'");
  }
  const TokenizerInfo& i = t->info();
  if (i.vocab_size != m.tokenizer.vocab_size || i.eos_id != m.tokenizer.eos_id || i.pad_id != m.tokenizer.pad_id)
    throw DataError(where + ": tokenizer vocab_size/eos_id/pad_id do not match the tokenizer");
  return t;
}

std::string train_sentencepiece(const SpTrainOptions& opt, const std::function<bool(std::string&)>& next_doc) {
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", opt.type},
      {"vocab_size", std::to_string(opt.vocab_size)},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"max_sentence_length", std::to_string(1 << 20)},
      {"unk_id", "0"},
      {"eos_id", "1"},
      {"pad_id", "2"},
      {"bos_id", "-1"},
      {"num_threads", "1"},
      {"minloglevel", "2"},
  };
  DocIterator it(next_doc);
  std::string model;
  auto st = sp::SentencePieceTrainer::Train(args, &it, &model);
  if (it.error()) std::rethrow_exception(it.error());
  if (!st.ok())
    throw DataError(strf("--vocab-size %llu: sentencepiece %s training failed: %s",
                         static_cast<unsigned long long>(opt.vocab_size), opt.type.c_str(),
                         strip_check_prefix(std::string(st.message())).c_str()));
  return model;
}

}  // namespace lm::data
