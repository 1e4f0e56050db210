// The local shard cache directory (data.cache_dir), shared safely by every run on the machine.
//
// Layout: DIR/<xxh64>-<bytes>-<file> is a complete shard whose bytes were checked against its
// manifest's xxh64 (content-addressed: datasets that share a shard share its file); "<key>.part" is
// a download in progress or interrupted (resumed by whoever fetches that shard next); DIR/.lock
// serializes the space accounting.
//
// Cross-process rules (flock(2), released by the kernel when a process dies):
//   - a shard in use is held with a shared lock on its file; eviction takes an exclusive lock
//     without waiting and skips what it cannot lock, so a shard in use is never evicted;
//   - a download holds an exclusive lock on its .part file, so a shard is downloaded once;
//   - space is reserved under DIR/.lock: a .part counts as its full size from its creation, and
//     complete files are evicted least recently used first (mtime, touched on every use).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace lm::data {

class CacheDir {
 public:
  // Creates the directory. limit_bytes: the most the complete and partial shards may take.
  CacheDir(const std::string& dir, uint64_t limit_bytes);

  const std::string& dir() const { return dir_; }
  uint64_t limit() const { return limit_; }
  static std::string key(const std::string& xxh64, uint64_t bytes, const std::string& file);
  std::string path(const std::string& key) const { return dir_ + "/" + key; }

  // The complete shard `key`, held (shared lock; mtime touched) while the result lives; null when
  // it is not here.
  std::shared_ptr<const void> hold(const std::string& key) const;
  // Makes sure "<key>.part" exists, making room for `bytes` under the limit first: evicts complete
  // shards and abandoned partial ones, least recently used first, skipping those in use and those
  // with keep[key] <= rank (this run's next shards, by position; rank < 0: evicts none of them).
  // False when there is no room now (what fills it is in use).
  bool reserve(const std::string& key, uint64_t bytes, const std::map<std::string, int>& keep, int rank) const;
  // Opens "<key>.part" for appending and locks it exclusively (waits while another downloads it).
  // Returns -1 when it is gone (committed or evicted meanwhile): call hold() again.
  int open_part(const std::string& key) const;
  // fsync, rename "<key>.part" to "<key>", fsync the directory; closes fd.
  void commit(const std::string& key, int fd) const;
  // Removes "<key>.part" (a download that came out wrong) and closes fd.
  void discard(const std::string& key, int fd) const;
  // Bytes the cache holds now (complete and partial shards).
  uint64_t used() const;

 private:
  std::string dir_;
  uint64_t limit_;
};

}  // namespace lm::data
