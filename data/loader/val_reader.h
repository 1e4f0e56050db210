// The validation reader: a plain sequential pass over one split of a prepared dataset. Documents are
// joined with EOS into one stream (TokenWalk, the loader's walk), cut into consecutive windows of
// seq_len+1 tokens (inputs = w[0:T], targets = w[1:T+1]); consecutive windows overlap by one token
// so no target is lost. Wraps around at the end of the split (epoch += 1). No shuffle, no workers;
// shards are opened one at a time, checked against the manifest, and their checksums are verified
// before their tokens are first used (all at construction with verify_all: data.verify full).
// Token ids at or above the vocabulary are refused (DataError naming shard and document).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/format/manifest.h"
#include "data/loader/token_walk.h"

namespace lm::data {

class ValReader {
 public:
  // Throws DataError naming the directory and split when the split has no shards or its stream
  // (tokens plus one EOS per document) is shorter than seq_len+1 tokens, or when a shard does not
  // match the manifest (the first shard at once, the others when the reader reaches them).
  ValReader(const Manifest& m, const std::string& split, int64_t seq_len, bool verify_all = false);
  ~ValReader();
  ValReader(const ValReader&) = delete;
  ValReader& operator=(const ValReader&) = delete;

  // Resizes out to batch*(T+1) and fills out[b*(T+1) .. (b+1)*(T+1)) with the next windows.
  void next(int64_t batch, std::vector<int64_t>& out);
  int64_t epoch() const { return epoch_; }
  void reset();  // back to the start of the split, epoch 0

 private:
  const ShardReader& open(size_t i);
  // Copies the next n tokens of the endless stream (the split, repeated) into dst.
  void read(uint32_t* dst, uint64_t n);

  Manifest manifest_;
  std::vector<ShardInfo> shards_;
  std::vector<bool> verified_;  // checksum checked (per shard)
  std::unique_ptr<ShardReader> cur_;  // the one open shard
  TokenWalk walk_;
  int64_t epoch_ = 0;
  int64_t carry_ = -1;  // last token of the previous window (overlap); -1 before the first
  std::vector<uint32_t> window_;
};

}  // namespace lm::data
