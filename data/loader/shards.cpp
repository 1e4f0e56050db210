// The loader's shard set and per-thread shard cache (see shards.h).
#include "data/loader/shards.h"

#include <algorithm>

#include "common/errors.h"

namespace lm::data {
namespace {

constexpr size_t kOpenShards = 2;  // per thread (each worker, and the planner)

}  // namespace

ShardSet::ShardSet(const Manifest& m, const std::string& split, bool verify_all, const Units& units)
    : manifest_(m), split_(split) {
  for (size_t i = 0; i < m.shards.size(); ++i) {
    if (m.shards[i].split != split) continue;
    auto e = std::make_unique<Entry>();
    e->info = m.shards[i];
    e->manifest_index = static_cast<uint32_t>(i);
    shards_.push_back(std::move(e));
  }
  if (shards_.empty()) throw DataError(m.dir + ": split '" + split + "' has no shards");
  for (auto& e : shards_) {  // one shard open at a time
    auto r = manifest_.open_shard(e->info);
    if (verify_all) manifest_.verify_shard(e->info);
    e->units = units(*r);
    e->verified = verify_all;  // lazy: checked on the pipeline's first open
  }
}

std::unique_ptr<ShardReader> ShardSet::open(size_t i) const {
  Entry& e = *shards_[i];
  {
    std::lock_guard<std::mutex> lk(e.mu);
    if (!e.verified) manifest_.verify_shard(e.info);
    e.verified = true;
  }
  return manifest_.open_shard(e.info);
}

const ShardReader& ShardCache::get(uint32_t i) {
  auto it = std::find_if(open_.begin(), open_.end(), [&](const auto& p) { return p.first == i; });
  if (it == open_.end()) {
    if (open_.size() == kOpenShards) open_.pop_back();
    open_.insert(open_.begin(), {i, set_.open(i)});
  } else if (it != open_.begin()) {
    std::rotate(open_.begin(), it, it + 1);
  }
  return *open_.front().second;
}

}  // namespace lm::data
