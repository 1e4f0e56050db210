// The plain sequential reader over one split (see reader.h).
#include "data/loader/val_reader.h"

#include <algorithm>

#include "data/format/shard.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm::data {

SequentialReader::SequentialReader(const Manifest& m, const std::string& split, int64_t seq_len)
    : manifest_(m), shards_(m.split(split)), seq_len_(seq_len), eos_(m.tokenizer.eos_id) {
  if (seq_len < 1) throw Error(strf("SequentialReader: seq_len must be >= 1 (got %lld)", static_cast<long long>(seq_len)));
  if (shards_.empty()) throw DataError(m.dir + ": split '" + split + "' has no shards");
  uint64_t stream = 0;
  for (const auto& s : shards_) stream += s.tokens + s.docs;
  if (stream < static_cast<uint64_t>(seq_len) + 1)
    throw DataError(strf("%s: split '%s' holds %llu tokens (EOS included), fewer than seq_len+1 = %lld",
                         m.dir.c_str(), split.c_str(), static_cast<unsigned long long>(stream),
                         static_cast<long long>(seq_len) + 1));
  window_.resize(static_cast<size_t>(seq_len) + 1);
  reset();
}

SequentialReader::~SequentialReader() = default;

void SequentialReader::reset() {
  epoch_ = 0;
  carry_ = -1;
  open_shard(0);
}

void SequentialReader::open_shard(size_t i) {
  const ShardInfo& info = shards_[i];
  cur_.reset();  // one shard open at a time
  cur_ = std::make_unique<ShardReader>(manifest_.dir + "/" + info.file);
  if (cur_->num_docs() != info.docs || cur_->num_tokens() != info.tokens ||
      (cur_->dtype() == TokenDtype::kU16) != (manifest_.dtype == "uint16"))
    throw DataError(cur_->path() + ": does not match its entry in manifest.json (docs, tokens or dtype)");
  shard_idx_ = i;
  doc_ = 0;
  in_doc_ = 0;
}

void SequentialReader::fill(uint32_t* dst, uint64_t n) {
  while (n > 0) {
    if (doc_ == cur_->num_docs()) {  // next shard, or the next epoch
      if (shard_idx_ + 1 == shards_.size()) ++epoch_;
      open_shard((shard_idx_ + 1) % shards_.size());
      continue;
    }
    const uint64_t len = cur_->doc_length(doc_);
    if (in_doc_ < len) {
      const uint64_t k = std::min(n, len - in_doc_);
      cur_->read_tokens(cur_->doc_offset(doc_) + in_doc_, k, dst);
      dst += k;
      n -= k;
      in_doc_ += k;
    } else {
      *dst++ = eos_;
      --n;
      ++doc_;
      in_doc_ = 0;
    }
  }
}

void SequentialReader::next(int64_t batch, std::vector<int64_t>& out) {
  const size_t w = window_.size();
  out.resize(static_cast<size_t>(batch) * w);
  for (int64_t b = 0; b < batch; ++b) {
    if (carry_ < 0) {
      fill(window_.data(), w);
    } else {
      window_[0] = static_cast<uint32_t>(carry_);
      fill(window_.data() + 1, w - 1);
    }
    carry_ = window_.back();
    std::copy(window_.begin(), window_.end(), out.begin() + static_cast<ptrdiff_t>(b * w));
  }
}

}  // namespace lm::data
