// manifest.json of a prepared dataset directory: what `prep` wrote and how to verify it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lm::data {

class ShardReader;

struct ShardInfo {
  std::string file;    // file name relative to the dataset directory
  std::string split;   // "train" or "val"
  uint64_t tokens = 0;
  uint64_t docs = 0;
  std::string xxh64;   // 16 hex digits of the whole shard file
  uint64_t bytes(const std::string& dtype) const;  // the file's size (FORMAT.md)
};

struct TokenizerInfo {
  std::string kind;        // "bytes" or "sentencepiece"
  uint64_t vocab_size = 0; // ids are < vocab_size
  uint32_t eos_id = 0;     // document separator
  uint32_t pad_id = 0;     // padding (never in the loss)
  std::string file;        // tokenizer model file in the dataset directory ("" for bytes)
  std::string hash;        // xxh64 hex of the tokenizer (model file bytes, or its kind for bytes)
};

// Where shards come from when the dataset is not a local directory: a remote store
// (data/remote/store.h) gives a local file with the shard's exact bytes, fetched and checked against
// the manifest on demand; raw text (data/text/text_source.h) builds the shard in memory.
class ShardSource {
 public:
  virtual ~ShardSource() = default;
  // Shard s, checked (the default: fetch() then the file's reader, holding the file).
  virtual std::unique_ptr<ShardReader> open(const ShardInfo& s);
  // Checks s's bytes against s.xxh64 (the default: fetch(), which checks them).
  virtual void verify(const ShardInfo& s);
  // "http", "s3" or "text" (meta.json's data.sources[].kind).
  virtual std::string kind() const = 0;
  // A local file holding exactly s's bytes (xxh64 checked against s.xxh64), kept on disk while
  // *hold lives. Blocks until it is there; throws DataError (bad data) or RemoteError (a fault
  // longer than data.remote_timeout_s), both naming the URL.
  virtual std::string fetch(const ShardInfo& s, std::shared_ptr<const void>* hold) = 0;
  // The shards the reader will open next, in order: the source may fetch them ahead.
  virtual void ahead(const std::vector<ShardInfo>& next) = 0;
  // Checks that the cache can hold `shards` of the largest shard at once (ConfigError naming the
  // minimum otherwise); `why` says what they are for.
  virtual void reserve(size_t shards, const std::string& why) = 0;
  // The source's location, for records ("https://...", "s3://bucket/prefix").
  virtual std::string location() const = 0;
  // The bytes of one of the dataset's own files named in the manifest (the tokenizer's model file),
  // unchecked; throws DataError (or RemoteError) naming it.
  virtual std::string read_file(const std::string& name) = 0;
};

struct Manifest {
  int version = 1;
  std::string dtype;               // "uint16" or "uint32"
  TokenizerInfo tokenizer;
  std::vector<ShardInfo> shards;   // in stream order
  std::string data_version;        // xxh64 hex over all shard checksums + tokenizer hash
  std::string dir;                 // set by load(): the directory (or URL) it was read from
  std::shared_ptr<ShardSource> source;  // remote datasets: where the shards' bytes come from

  // Reads DIR/manifest.json. Throws DataError naming the file and the problem.
  static Manifest load(const std::string& dir);
  // Parses manifest.json's text read from `where` (errors name it); dir is set to `dir`.
  static Manifest parse(const std::string& text, const std::string& where, const std::string& dir);
  // Shards of one split, in order.
  std::vector<ShardInfo> split(const std::string& name) const;
  uint64_t split_tokens(const std::string& name) const;
  // THE check of a shard file against its entry: opens DIR/s.file (ShardReader checks the header
  // and file size) and compares its document count, token count and token width with `s` and
  // `dtype`. The checksum is verify_shard()'s. Throws DataError naming the file.
  std::unique_ptr<ShardReader> open_shard(const ShardInfo& s) const;
  // Recomputes the xxh64 of shard `s`'s file; throws DataError naming the file when it differs.
  // A remote source checks the bytes itself when it fetches them.
  void verify_shard(const ShardInfo& s) const;
  // verify_shard() for every shard, and the tokenizer file's hash; throws on the first that differs.
  // (Local datasets only.)
  void verify() const;
  std::string to_json() const;  // the exact bytes prep writes
};

// The data version id: xxh64 over the shard checksums (in order) and the tokenizer hash.
std::string compute_data_version(const std::vector<ShardInfo>& shards, const std::string& tokenizer_hash);

}  // namespace lm::data
