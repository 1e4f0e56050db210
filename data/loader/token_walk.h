// The EOS-joined token stream of a sequence of shards: every document's tokens followed by one
// tokenizer.eos_id (FORMAT.md stores documents without separators). This is THE walk over a split's
// documents: the loader reads its packed windows and bucketed samples through it, and ValReader
// its sequential windows.
#pragma once

#include <cstdint>
#include <functional>

namespace lm::data {

class ShardReader;

// A position in the stream of shards 0 .. count-1 of some sequence, and the copying of the tokens
// from there on. A shard's part of the stream is num_tokens() + num_docs() tokens long; document d
// starts at its stream offset doc_offset(d) + d. Not thread-safe; the shards belong to the caller.
class TokenWalk {
 public:
  // open(i) returns shard i of the sequence; the reference must stay valid until the next open().
  // The walk holds on to the current shard only.
  using Open = std::function<const ShardReader&(size_t i)>;
  // Every id read must be < vocab (the manifest's tokenizer.vocab_size): read() checks the tokens
  // it copies and throws DataError naming the shard, document and id of the first that is not.
  TokenWalk(size_t count, uint32_t eos, uint32_t vocab, Open open);

  // Moves to stream offset q of shard i (opens it; binary search over its documents).
  // REQUIRES: i < count, q <= its stream length.
  void seek(size_t i, uint64_t q);
  // Moves to token `offset` of document `doc` of shard i (offset == the document's length: its EOS).
  void seek(size_t i, uint64_t doc, uint64_t offset);
  // Copies the next tokens of the stream into dst[0, n) and moves past them. Returns how many it
  // copied: fewer than n only when the sequence's last shard is done (the walk then stays there).
  // A shard is left only when a token past its end is needed.
  uint64_t read(uint32_t* dst, uint64_t n);

  size_t shard() const { return shard_; }  // index in the sequence
  uint64_t doc() const { return doc_; }    // document in that shard
  uint64_t offset() const { return off_; } // tokens of doc() already read; == its length: its EOS is next

 private:
  size_t count_;
  uint32_t eos_, vocab_;
  Open open_;
  const ShardReader* cur_ = nullptr;  // shard_ of the sequence
  size_t shard_ = 0;
  uint64_t doc_ = 0, off_ = 0;
};

}  // namespace lm::data
