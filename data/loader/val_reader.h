// A plain sequential reader over one split of a prepared dataset (the foundation's reader; the
// streaming loader replaces it). Documents are joined with EOS into one stream, cut into
// consecutive windows of seq_len+1 tokens (inputs = w[0:T], targets = w[1:T+1]); consecutive
// windows overlap by one token so no target is lost. Wraps around at the end of the split
// (epoch += 1). Shards are read through ShardReader, one open at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/format/manifest.h"

namespace lm::data {

class ShardReader;

class SequentialReader {
 public:
  // Throws DataError naming the directory and split when the split has no shards or its stream
  // (tokens plus one EOS per document) is shorter than seq_len+1 tokens, or when a shard does not
  // match the manifest.
  SequentialReader(const Manifest& m, const std::string& split, int64_t seq_len);
  ~SequentialReader();
  SequentialReader(const SequentialReader&) = delete;
  SequentialReader& operator=(const SequentialReader&) = delete;

  // Resizes out to batch*(T+1) and fills out[b*(T+1) .. (b+1)*(T+1)) with the next windows.
  void next(int64_t batch, std::vector<int64_t>& out);
  int64_t epoch() const { return epoch_; }
  void reset();  // back to the start of the split, epoch 0

 private:
  void open_shard(size_t i);
  // Copies the next n tokens of the (endless) stream into dst.
  void fill(uint32_t* dst, uint64_t n);
  Manifest manifest_;
  std::vector<ShardInfo> shards_;
  int64_t seq_len_;
  uint32_t eos_;
  std::unique_ptr<ShardReader> cur_;  // shards_[shard_idx_]
  size_t shard_idx_ = 0;
  uint64_t doc_ = 0;            // current document in cur_
  uint64_t in_doc_ = 0;         // tokens of doc_ already emitted; == its length: its EOS is next
  int64_t epoch_ = 0;
  int64_t carry_ = -1;          // last token of the previous window (overlap); -1 before the first
  std::vector<uint32_t> window_;
};

}  // namespace lm::data
