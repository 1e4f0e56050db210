// Token shards on disk: the writer used by `prep` and the reader used by the loader.
// The byte layout is specified in data/FORMAT.md; this header is its C++ contract.
//
// A shard holds whole documents (never EOS-joined: the loader inserts separators) as uint16 or
// uint32 token ids, plus an offset index so document i can be read without scanning.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lm::data {

enum class TokenDtype : uint32_t { kU16 = 2, kU32 = 4 };  // value = bytes per token

// The smallest dtype that holds ids < vocab_size.
TokenDtype dtype_for_vocab(uint64_t vocab_size);

// A shard built in memory (a raw-text chunk the loader tokenized, data/text/): the index and the
// packed tokens a file would hold.
struct MemoryShard {
  TokenDtype dtype = TokenDtype::kU16;
  std::vector<uint64_t> offsets{0};  // num_docs + 1
  std::vector<uint8_t> tokens;       // packed little-endian ids
};

// Writes one shard atomically (temp name, fsync, rename on finish()). Not thread-safe.
class ShardWriter {
 public:
  ShardWriter(const std::string& path, TokenDtype dtype);
  ~ShardWriter();  // without finish(): the temp file is removed, `path` untouched
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // REQUIRES: every id fits the dtype (throws lm::Error otherwise).
  void add_document(const uint32_t* tokens, size_t n);
  uint64_t num_docs() const { return offsets_.size() - 1; }
  uint64_t num_tokens() const { return offsets_.back(); }
  // Writes header + index + tokens; returns the file's xxh64.
  uint64_t finish();
  // The shard in memory instead of a file (`path` only names it in messages).
  std::shared_ptr<const MemoryShard> finish_in_memory();

 private:
  std::string path_;
  TokenDtype dtype_;
  std::vector<uint64_t> offsets_{0};
  std::vector<uint8_t> tokens_;  // packed little-endian ids
  bool finished_ = false;
};

// Read-only view of one shard (memory-mapped). Validates magic, version, dtype and sizes on open
// and throws DataError naming the file if anything is off. Thread-safe for concurrent reads.
class ShardReader {
 public:
  explicit ShardReader(const std::string& path);
  // A view of a shard in memory, kept alive by the reader; `name` stands for the path in messages.
  ShardReader(std::string name, std::shared_ptr<const MemoryShard> shard);
  ~ShardReader();
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  TokenDtype dtype() const { return dtype_; }
  uint64_t num_docs() const { return num_docs_; }
  uint64_t num_tokens() const { return num_tokens_; }
  // Start of document i in the shard's token stream; doc_offset(num_docs()) == num_tokens().
  uint64_t doc_offset(uint64_t i) const;
  uint64_t doc_length(uint64_t i) const { return doc_offset(i + 1) - doc_offset(i); }
  // Copies tokens [begin, begin+n) of the shard's token stream into out (as uint32).
  void read_tokens(uint64_t begin, uint64_t n, uint32_t* out) const;
  std::vector<uint32_t> read_doc(uint64_t i) const;
  // Keeps `h` alive as long as the reader (a remote cache's hold on the file, manifest.h).
  void hold(std::shared_ptr<const void> h) { hold_ = std::move(h); }

 private:
  std::shared_ptr<const void> hold_;
  std::string path_;
  TokenDtype dtype_ = TokenDtype::kU16;
  uint64_t num_docs_ = 0, num_tokens_ = 0;
  const uint8_t* base_ = nullptr;  // mmap of the whole file
  size_t size_ = 0;
  const uint64_t* index_ = nullptr;  // num_docs_ + 1 offsets
  const uint8_t* tokens_ = nullptr;
};

}  // namespace lm::data
