// The loader's shards (internal to data/loader): one split's shards, checked against the manifest,
// with lazy checksums shared by all threads, and the small per-thread cache of open shards.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "data/format/manifest.h"
#include "data/format/shard.h"

namespace lm::data {

// One split's shards in manifest order. Thread-safe after construction.
class ShardSet {
 public:
  // What a shard contributes to the sample stream (the planner's units: stream tokens or samples).
  using Units = std::function<uint64_t(const ShardReader&)>;
  // The same from the shard's manifest entry, when the entry tells (packed mode); else null.
  using ListedUnits = std::function<uint64_t(const ShardInfo&)>;

  // Opens every shard of `split` once, one at a time: checks it against the manifest
  // (Manifest::open_shard), its checksum too when verify_all, and records units(shard). A remote
  // dataset's shards are not fetched for this when `listed` tells their units (and !verify_all):
  // they are checked when first opened, units(shard) against the listed units too. Throws DataError
  // naming the directory when the split has no shards, or naming the file.
  ShardSet(const Manifest& m, const std::string& split, bool verify_all, const Units& units,
           const ListedUnits& listed = nullptr);
  ShardSet(const ShardSet&) = delete;
  ShardSet& operator=(const ShardSet&) = delete;

  size_t size() const { return shards_.size(); }
  const std::string& dir() const { return manifest_.dir; }
  const std::string& split() const { return split_; }
  uint64_t units(size_t i) const { return shards_[i]->units; }
  uint32_t manifest_index(size_t i) const { return shards_[i]->manifest_index; }
  // Opens shard i checked against the manifest; on its first open here its checksum is verified
  // (unless verify_all did it). Throws DataError naming the file.
  std::unique_ptr<ShardReader> open(size_t i) const;

  // Remote datasets: how many shards the loader wants at hand (`span`, those a shuffle block can
  // touch, and `ahead` = data.remote_ahead more). The cache must hold them, and at least one shard per reading thread
  // and one being fetched (ConfigError naming the minimum otherwise).
  void plan_ahead(size_t span, size_t ahead, size_t readers);
  size_t ahead_count() const { return ahead_; }
  // The most shards a stretch of `units` consecutive stream units can touch, in any shard order.
  size_t max_span(uint64_t units) const;
  bool remote() const { return manifest_.source != nullptr; }
  // Tells the remote source the shards to be read next (split indices, in order).
  void read_ahead(const std::vector<uint32_t>& next) const;

 private:
  struct Entry {
    ShardInfo info;
    uint32_t manifest_index = 0;
    uint64_t units = 0;
    std::mutex mu;  // guards verified and units_listed
    bool verified = false;
    bool units_listed = false;  // units from the manifest entry, not yet checked against the shard
  };
  Manifest manifest_;
  std::string split_;
  Units units_;
  std::vector<std::unique_ptr<Entry>> shards_;
  size_t ahead_ = 0;
};

// The few shards one thread has open, most recently used first: at most 16 (with 2, unmapping and
// mapping again cut the loader to a third on 250K-token shards, whose shuffle blocks span 16). The
// reference get() returns stays valid until the second get() of another shard (remote datasets:
// the next get() of another shard, as a miss lets go of every shard held before it waits for the
// cache).
class ShardCache {
 public:
  explicit ShardCache(const ShardSet& set) : set_(set) {}
  const ShardReader& get(uint32_t i);
  void clear() { open_.clear(); }

 private:
  const ShardSet& set_;
  std::vector<std::pair<uint32_t, std::unique_ptr<ShardReader>>> open_;
};

}  // namespace lm::data
