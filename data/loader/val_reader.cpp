// The sequential validation reader over one split (see val_reader.h).
#include "data/loader/val_reader.h"

#include <algorithm>

#include "data/format/shard.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm::data {

ValReader::ValReader(const Manifest& m, const std::string& split, int64_t seq_len, bool verify_all)
    : manifest_(m), shards_(m.split(split)), verified_(shards_.size(), false),
      walk_(shards_.size(), m.tokenizer.eos_id, m.tokenizer.vocab_size,
            [this](size_t i) -> const ShardReader& { return open(i); }) {
  if (seq_len < 1) throw Error(strf("ValReader: seq_len must be >= 1 (got %lld)", static_cast<long long>(seq_len)));
  if (shards_.empty()) throw DataError(m.dir + ": split '" + split + "' has no shards");
  uint64_t stream = 0;
  for (const auto& s : shards_) stream += s.tokens + s.docs;
  if (stream < static_cast<uint64_t>(seq_len) + 1)
    throw DataError(strf("%s: split '%s' holds %llu tokens (EOS included), fewer than seq_len+1 = %lld",
                         m.dir.c_str(), split.c_str(), static_cast<unsigned long long>(stream),
                         static_cast<long long>(seq_len) + 1));
  if (verify_all)
    for (size_t i = 0; i < shards_.size(); ++i) manifest_.verify_shard(shards_[i]), verified_[i] = true;
  window_.resize(static_cast<size_t>(seq_len) + 1);
  reset();
}

ValReader::~ValReader() = default;

void ValReader::reset() {
  epoch_ = 0;
  carry_ = -1;
  walk_.seek(0, 0);
}

const ShardReader& ValReader::open(size_t i) {
  cur_.reset();  // one shard open at a time
  if (!verified_[i]) manifest_.verify_shard(shards_[i]);  // lazy: before its tokens are first used
  verified_[i] = true;
  cur_ = manifest_.open_shard(shards_[i]);
  return *cur_;
}

void ValReader::read(uint32_t* dst, uint64_t n) {
  for (uint64_t k; (k = walk_.read(dst, n)) < n; dst += k, n -= k) {  // the split is done: wrap around
    ++epoch_;
    walk_.seek(0, 0);
  }
}

void ValReader::next(int64_t batch, std::vector<int64_t>& out) {
  const size_t w = window_.size();
  out.resize(static_cast<size_t>(batch) * w);
  for (int64_t b = 0; b < batch; ++b) {
    if (carry_ < 0) {
      read(window_.data(), w);
    } else {
      window_[0] = static_cast<uint32_t>(carry_);
      read(window_.data() + 1, w - 1);
    }
    carry_ = window_.back();
    std::copy(window_.begin(), window_.end(), out.begin() + static_cast<ptrdiff_t>(b * w));
  }
}

}  // namespace lm::data
