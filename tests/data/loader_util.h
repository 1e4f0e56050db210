// What the loader tests share (loader_test.cpp, loader_error_test.cpp): tiny synthetic datasets and
// loader configs.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <thread>

#include "data/loader/loader.h"
#include "data/format/manifest.h"
#include "data/format/shard.h"
#include "tests/testutil.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"

namespace lm::data::loader_test {

using Docs = std::vector<std::vector<uint32_t>>;


// A dataset of "train" shards plus one "val" shard. EOS = vocab-2, PAD = vocab-1.
inline Manifest make_dataset(const std::string& dir, const std::vector<Docs>& shards, uint64_t vocab = 258) {
  Manifest m;
  m.dtype = dtype_for_vocab(vocab) == TokenDtype::kU16 ? "uint16" : "uint32";
  m.tokenizer = {vocab == 258 ? "bytes" : "sentencepiece", vocab, static_cast<uint32_t>(vocab - 2), static_cast<uint32_t>(vocab - 1), "",
                 hex64(xxh64("bytes", 5))};
  std::vector<std::pair<std::string, Docs>> all;
  for (const auto& d : shards) all.emplace_back("train", d);
  all.emplace_back("val", Docs{{1, 2, 3}});
  for (size_t i = 0; i < all.size(); ++i) {
    ShardInfo s{all[i].first + "_" + std::to_string(i) + ".bin", all[i].first, 0, all[i].second.size(), ""};
    ShardWriter w(dir + "/" + s.file, dtype_for_vocab(vocab));
    for (const auto& d : all[i].second) w.add_document(d.data(), d.size()), s.tokens += d.size();
    s.xxh64 = hex64(w.finish());
    m.shards.push_back(s);
  }
  m.data_version = compute_data_version(m.shards, m.tokenizer.hash);
  files::write_file_atomic(dir + "/manifest.json", m.to_json());
  m.dir = dir;
  return m;
}

// Random documents of lengths in [lo, hi]; with `unique`, every token id in the dataset differs.
inline std::vector<Docs> random_shards(const std::vector<int>& docs_per_shard, int lo, int hi, unsigned seed, bool unique = false) {
  std::mt19937 g(seed);
  uint32_t next = 10;
  std::vector<Docs> out;
  for (int n : docs_per_shard) {
    Docs docs;
    for (int d = 0; d < n; ++d) {
      std::vector<uint32_t> doc(std::uniform_int_distribution<int>(lo, hi)(g));
      for (auto& t : doc) t = unique ? next++ : std::uniform_int_distribution<uint32_t>(0, 255)(g);
      docs.push_back(doc);
    }
    out.push_back(docs);
  }
  return out;
}

inline DataConfig config(const std::string& mode, int64_t workers = 2, int64_t prefetch = 4) {
  DataConfig c;
  c.mode = mode;
  c.workers = workers;
  c.prefetch = prefetch;
  return c;
}


}  // namespace lm::data::loader_test
