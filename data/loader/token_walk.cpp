// The EOS-joined token walk over a sequence of shards (see token_walk.h).
#include "data/loader/token_walk.h"

#include <algorithm>
#include <utility>

#include "common/errors.h"
#include "common/log.h"
#include "data/format/shard.h"

namespace lm::data {

TokenWalk::TokenWalk(size_t count, uint32_t eos, uint32_t vocab, Open open)
    : count_(count), eos_(eos), vocab_(vocab), open_(std::move(open)) {}

void TokenWalk::seek(size_t i, uint64_t q) {
  const ShardReader& s = open_(i);
  uint64_t lo = 0, hi = s.num_docs();  // the last document starting at or before q
  while (hi - lo > 1) {
    const uint64_t mid = (lo + hi) / 2;
    (s.doc_offset(mid) + mid <= q ? lo : hi) = mid;
  }
  cur_ = &s;
  shard_ = i;
  doc_ = lo;
  off_ = q - (s.doc_offset(lo) + lo);
}

void TokenWalk::seek(size_t i, uint64_t doc, uint64_t offset) {
  cur_ = &open_(i);
  shard_ = i;
  doc_ = doc;
  off_ = offset;
}

uint64_t TokenWalk::read(uint32_t* dst, uint64_t n) {
  uint64_t k = 0;
  while (k < n) {
    if (doc_ == cur_->num_docs()) {  // this shard is done: the next one, if any
      if (shard_ + 1 == count_) break;
      cur_ = &open_(++shard_);
      doc_ = off_ = 0;
      continue;
    }
    const uint64_t len = cur_->doc_length(doc_);
    if (off_ < len) {
      const uint64_t c = std::min(len - off_, n - k);
      cur_->read_tokens(cur_->doc_offset(doc_) + off_, c, dst + k);
      // A hand-edited or buggy shard whose checksum matches: caught here, before the model sees it.
      const uint32_t* bad = std::find_if(dst + k, dst + k + c, [&](uint32_t id) { return id >= vocab_; });
      if (bad != dst + k + c)
        throw DataError(strf("%s: document %llu: token id %u (token %llu of the document) is not below the vocabulary "
                             "size %u (manifest.json tokenizer.vocab_size)", cur_->path().c_str(),
                             static_cast<unsigned long long>(doc_), *bad,
                             static_cast<unsigned long long>(off_ + static_cast<uint64_t>(bad - (dst + k))), vocab_));
      k += c, off_ += c;
    } else {
      dst[k++] = eos_;
      ++doc_, off_ = 0;
    }
  }
  return k;
}

}  // namespace lm::data
