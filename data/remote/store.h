// Datasets wherever they live: a local directory written by `prep`, or the same files behind an
// http(s):// or s3:// location (http.h), read through the shared local cache (cache_dir.h).
//
// A remote dataset's manifest.json is read at open; its shards are fetched on first use into the
// cache, checked against the manifest's xxh64 before anything reads them, and kept there while in
// use. The loader tells the store which shards it will read next (ShardSource::ahead, in the order
// of its shuffle plan) and a background thread fetches them ahead, evicting least recently used
// shards that no run is using and that this run does not need before them.
#pragma once

#include <cstdint>
#include <string>

#include "data/format/manifest.h"

namespace lm::data {

struct RemoteOptions {
  std::string cache_dir = ".cache/shards";  // data.cache_dir
  uint64_t cache_limit_bytes = 0;           // data.cache_limit_mb
  double timeout_s = 120;                   // data.remote_timeout_s
};

// The dataset at `location` (`key`: the config key it came from, for messages). Local: Manifest::
// load(location). Remote: manifest.json fetched, `source` set. Throws ConfigError naming `key` on a
// malformed location, DataError naming the URL on bad data or a 4xx answer, RemoteError when the
// location stays unreachable for longer than the timeout.
Manifest open_dataset(const std::string& location, const std::string& key, const RemoteOptions& o);

}  // namespace lm::data
