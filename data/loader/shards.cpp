// The loader's shard set and per-thread shard cache (see shards.h).
#include "data/loader/shards.h"

#include <algorithm>

#include "common/errors.h"
#include "common/log.h"

namespace lm::data {
namespace {

constexpr size_t kOpenShards = 16;  // per thread (each worker, and the planner); see ShardCache

}  // namespace

ShardSet::ShardSet(const Manifest& m, const std::string& split, bool verify_all, const Units& units,
                   const ListedUnits& listed)
    : manifest_(m), split_(split), units_(units) {
  for (size_t i = 0; i < m.shards.size(); ++i) {
    if (m.shards[i].split != split) continue;
    auto e = std::make_unique<Entry>();
    e->info = m.shards[i];
    e->manifest_index = static_cast<uint32_t>(i);
    shards_.push_back(std::move(e));
  }
  if (shards_.empty()) throw DataError(m.dir + ": split '" + split + "' has no shards");
  for (auto& e : shards_) {  // one shard open at a time
    if (m.source && listed && !verify_all) {  // remote: checked when first opened, not fetched now
      e->units = listed(e->info);
      e->units_listed = true;
      continue;
    }
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
  auto r = manifest_.open_shard(e.info);
  std::lock_guard<std::mutex> lk(e.mu);
  if (e.units_listed) {  // the plan counted on the manifest's numbers: the shard must give as many units
    const uint64_t got = units_(*r);
    if (got != e.units)
      throw DataError(strf("%s/%s: holds %llu samples, not the %llu its manifest entry implies (an empty document?); "
                           "the plan was made from the manifest", manifest_.dir.c_str(), e.info.file.c_str(),
                           static_cast<unsigned long long>(got), static_cast<unsigned long long>(e.units)));
    e.units_listed = false;
  }
  return r;
}

void ShardSet::plan_ahead(size_t span, size_t ahead, size_t readers) {
  if (!remote()) return;
  ahead_ = std::min(span + ahead, shards_.size());
  const size_t need = std::min(std::max(ahead_, readers + 1), shards_.size());
  manifest_.source->reserve(need, strf("the loader needs %zu shards at hand (a shuffle block touches up to %zu, "
                                       "data.remote_ahead adds %zu; at least one per reading thread and one being "
                                       "fetched):", need, span, ahead));
}

size_t ShardSet::max_span(uint64_t units) const {
  std::vector<uint64_t> u;
  for (const auto& e : shards_) u.push_back(e->units);
  std::sort(u.begin(), u.end());
  size_t k = 0;  // whole shards strictly inside the stretch: the smallest ones at most
  for (uint64_t sum = 0; k < u.size() && sum + u[k] < units; ++k) sum += u[k];
  return std::min(u.size(), k + 2);
}

void ShardSet::read_ahead(const std::vector<uint32_t>& next) const {
  std::vector<ShardInfo> infos;
  for (uint32_t i : next) infos.push_back(shards_[i]->info);
  manifest_.source->ahead(infos);
}

const ShardReader& ShardCache::get(uint32_t i) {
  auto it = std::find_if(open_.begin(), open_.end(), [&](const auto& p) { return p.first == i; });
  if (it == open_.end()) {
    if (set_.remote()) open_.clear();  // hold nothing while waiting for the cache
    else if (open_.size() == kOpenShards) open_.pop_back();
    open_.insert(open_.begin(), {i, set_.open(i)});
  } else if (it != open_.begin()) {
    std::rotate(open_.begin(), it, it + 1);
  }
  return *open_.front().second;
}

}  // namespace lm::data
