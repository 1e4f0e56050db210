// Remote datasets through the local cache (see store.h).
#include "data/remote/store.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "data/remote/cache_dir.h"
#include "data/remote/http.h"

namespace lm::data {
namespace {

using Clock = std::chrono::steady_clock;

Http with_cancel(Http h, const std::atomic<bool>* cancel) {
  h.set_cancel(cancel);
  return h;
}

class RemoteStore : public ShardSource {
 public:
  RemoteStore(Http http, const RemoteOptions& o, std::string dtype, uint64_t max_shard)
      : http_(with_cancel(std::move(http), &cancel_)), cache_(o.cache_dir, o.cache_limit_bytes), dtype_(std::move(dtype)),
        max_shard_(max_shard), timeout_s_(o.timeout_s), thread_([this] { run_ahead(); }) {}

  ~RemoteStore() override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cancel_ = true;  // a fetch ahead in flight stops now, not after its retries
    cv_.notify_all();
    thread_.join();
  }

  std::string location() const override { return http_.where().location; }
  std::string kind() const override { return http_.where().s3 ? "s3" : "http"; }
  std::string read_file(const std::string& name) override { return http_.get(name); }

  void reserve(size_t shards, const std::string& why) override {
    const uint64_t need = shards * max_shard_;
    if (cache_.limit() >= need) return;
    const double mib = 1 << 20;
    throw ConfigError(strf("key 'data.cache_limit_mb': %g is too small: %s at least %.2f MiB (%zu shards of up to "
                           "%.2f MiB)", cache_.limit() / mib, why.c_str(), std::ceil(need / mib * 100) / 100, shards,
                           max_shard_ / mib));
  }

  std::string fetch(const ShardInfo& s, std::shared_ptr<const void>* hold) override {
    const std::string key = key_of(s);
    for (;;) {
      if ((*hold = checked_hold(s, key))) return cache_.path(key);
      download(s, key, /*demand=*/true);
    }
  }

  void ahead(const std::vector<ShardInfo>& next) override {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::string> keys;
    for (const auto& s : next) keys.push_back(key_of(s));
    if (keys == order_) return;
    order_ = keys, infos_ = next;
    keep_.clear();
    for (size_t i = 0; i < keys.size(); ++i) keep_.emplace(keys[i], static_cast<int>(i));
    ++generation_;
    cv_.notify_all();
  }

 private:
  std::string key_of(const ShardInfo& s) const { return CacheDir::key(s.xxh64, s.bytes(dtype_), s.file); }

  std::map<std::string, int> keep() const {
    std::lock_guard<std::mutex> lk(mu_);
    return keep_;
  }

  // The cached shard, held, its bytes checked once per process (a file another run left may have
  // rotted on disk since); null when it is not (or no longer) in the cache.
  std::shared_ptr<const void> checked_hold(const ShardInfo& s, const std::string& key) {
    auto h = cache_.hold(key);
    if (!h) return nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (checked_.count(key)) return h;
    }
    const std::string got = hex64(xxh64_file(cache_.path(key)));
    if (got != s.xxh64) {
      log::warn(strf("data cache: %s has checksum %s, not %s: fetching it again", cache_.path(key).c_str(), got.c_str(),
                     s.xxh64.c_str()));
      h.reset();
      files::file_system().remove(cache_.path(key).c_str());
      return nullptr;
    }
    std::lock_guard<std::mutex> lk(mu_);
    checked_.insert(key);
    return h;
  }

  // Downloads shard s into the cache unless it is there. demand: a reader waits for it, so it may
  // evict this run's later shards and waits (up to the timeout) for room; ahead: gives up (false)
  // when there is no room now.
  bool download(const ShardInfo& s, const std::string& key, bool demand) {
    const auto t0 = Clock::now();
    for (;;) {
      const auto keep_now = keep();
      auto it = keep_now.find(key);
      const int rank = it == keep_now.end() ? 0 : it->second;
      if (cache_.reserve(key, s.bytes(dtype_), keep_now, rank)) break;
      if (!demand) return false;
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (waited > timeout_s_)
        throw RemoteError(strf("data.cache_dir %s: no room for %s for %.0f s: the cache (data.cache_limit_mb = %.0f) "
                               "is full of shards in use", cache_.dir().c_str(), http_.url(s.file).c_str(), waited,
                               cache_.limit() / double(1 << 20)));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const int fd = cache_.open_part(key);
    if (fd < 0) return true;  // someone else finished (or dropped) it: look again
    const std::string part = cache_.path(key) + ".part";
    try {
      http_.download(s.file, fd, part, s.bytes(dtype_));
    } catch (...) {
      ::close(fd);  // the .part stays: the next try resumes it
      throw;
    }
    const std::string got = hex64(xxh64_file(part));
    if (got != s.xxh64) {
      cache_.discard(key, fd);
      std::lock_guard<std::mutex> lk(mu_);
      if (++corrupt_[key] >= 2)
        throw DataError(http_.url(s.file) + ": checksum " + got + " does not match manifest.json (" + s.xxh64 + ")");
      return true;  // fetched again by the caller's next round
    }
    cache_.commit(key, fd);
    std::lock_guard<std::mutex> lk(mu_);
    checked_.insert(key);
    return true;
  }

  // The background fetcher: keeps the shards of the latest ahead() list in the cache, in order.
  void run_ahead() {
    std::unique_lock<std::mutex> lk(mu_);
    uint64_t done = 0, tried = 0;
    for (;;) {  // a list not fully fetched is tried again after half a second, a new list at once
      cv_.wait_for(lk, std::chrono::milliseconds(500), [&] { return stop_ || generation_ != tried; });
      if (stop_) return;
      if (generation_ == done) continue;
      const uint64_t gen = generation_;
      tried = gen;  // the pause lets a reader waiting for a .part this thread was retrying take it
      const std::vector<ShardInfo> infos = infos_;
      lk.unlock();
      bool complete = true;
      for (const auto& s : infos) {
        if (stopping()) return;
        const std::string key = key_of(s);
        try {
          if (files::exists(cache_.path(key))) continue;
          if (!download(s, key, /*demand=*/false)) {
            complete = false;  // no room yet: try again when readers moved on
            break;
          }
        } catch (const std::exception& e) {
          if (!cancel_ && last_warning_ != e.what()) log::warn(std::string("data cache: fetching ahead: ") + e.what());
          last_warning_ = e.what();  // the same fault, tried again every half second, is said once
          complete = false;
          break;
        }
      }
      lk.lock();
      if (complete) done = gen;  // else `done` stays behind: tried again
    }
  }

  bool stopping() const {
    std::lock_guard<std::mutex> lk(mu_);
    return stop_;
  }

  Http http_;  // its fetches ahead stop when cancel_ is set (the demand fetches have ended by then)
  CacheDir cache_;
  std::string dtype_;
  uint64_t max_shard_;
  double timeout_s_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t generation_ = 0;
  std::vector<std::string> order_;
  std::vector<ShardInfo> infos_;
  std::map<std::string, int> keep_;
  std::set<std::string> checked_;
  std::map<std::string, int> corrupt_;
  std::atomic<bool> cancel_{false};
  std::string last_warning_;  // the fetcher thread's
  std::thread thread_;  // last: started when everything above exists
};

}  // namespace

Manifest open_dataset(const std::string& location, const std::string& key, const RemoteOptions& o) {
  if (!is_remote(location)) return Manifest::load(location);
  Http http(parse_location(location, key), o.timeout_s);
  Manifest m = Manifest::parse(http.get("manifest.json"), http.url("manifest.json"), location);
  uint64_t max_shard = 0;
  for (const auto& s : m.shards) max_shard = std::max(max_shard, s.bytes(m.dtype));
  m.source = std::make_shared<RemoteStore>(std::move(http), o, m.dtype, max_shard);
  return m;
}

}  // namespace lm::data
