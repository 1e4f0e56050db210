// loader_bench: throughput and memory of the streaming loader (data/loader/loader.h), torch-free.
//
//   loader_bench --data DIR [--mode packed|bucketed] [--workers N] [--prefetch N] [--seq T]
//                [--batch B] [--batches N] [--warmup N] [--memcpy] [--sources N]
//       reads N batches of the train split (after `warmup` batches) and prints one JSON line:
//       real tokens/s, output bytes/s (inputs + targets, int64), the mean wait in next(), and the
//       peak VmRSS / RssAnon / RssFile sampled every 5 ms from /proc/self/status, and startup_s (the
//       loader's construction: opening and checking every shard).
//       --sources N (N >= 1): a mixture (data.sources) of N sources s0..s<N-1>, all reading DIR, with
//       weights 1..N; 0 (default): the one-source data.train loader. --source-data D1,D2,...: the
//       i-th source reads D(i mod count) instead (distinct datasets, as a real mixture's are).
//       --memcpy adds the machine's single-thread memcpy bandwidth (256 MiB buffers) to the line.
//   loader_bench --memcpy                                   the memcpy figure alone
//   loader_bench --generate DIR --tokens N [--shard-tokens N] [--seed S]
//       writes a synthetic dataset (bytes tokenizer, random documents of 1..2047 random bytes,
//       uint16 shards, valid manifest) of N train tokens plus a small val shard.
#include <CLI/CLI.hpp>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>
#include <vector>

#include "data/loader/loader.h"
#include "data/remote/store.h"
#include "data/format/shard.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"

namespace {

using Clock = std::chrono::steady_clock;
using lm::clock::seconds_since;

// Peak of the /proc/self/status memory lines (kB), sampled by a thread until destroyed.
class RssSampler {
 public:
  RssSampler() : thread_([this] { while (!done_) { sample(); std::this_thread::sleep_for(std::chrono::milliseconds(5)); } }) {}
  ~RssSampler() {
    done_ = true;
    thread_.join();
  }
  void sample() {
    std::ifstream f("/proc/self/status");
    for (std::string line; std::getline(f, line);) {
      auto peak = [&](const char* key, std::atomic<long>& v) {
        if (line.rfind(key, 0) == 0) v = std::max(v.load(), std::atol(line.c_str() + std::strlen(key)));
      };
      peak("VmRSS:", rss), peak("RssAnon:", anon), peak("RssFile:", file);
    }
  }
  std::atomic<long> rss{0}, anon{0}, file{0};

 private:
  std::atomic<bool> done_{false};
  std::thread thread_;
};

double memcpy_bytes_per_s() {
  const size_t n = size_t{256} << 20;
  std::vector<char> a(n, 1), b(n, 2);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    auto t0 = Clock::now();
    std::memcpy(b.data(), a.data(), n);
    best = std::max(best, n / seconds_since(t0));
    std::swap(a, b);
  }
  return best;
}

void generate(const std::string& dir, uint64_t tokens, uint64_t shard_tokens, uint64_t seed) {
  using namespace lm;
  files::make_dirs(dir);
  data::Manifest m;
  m.dtype = "uint16";
  m.tokenizer = {"bytes", 258, 256, 257, "", hex64(xxh64("bytes", 5))};
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  auto rnd = [&] { x ^= x << 13, x ^= x >> 7, x ^= x << 17; return x; };  // xorshift64
  std::vector<uint32_t> doc;
  auto write = [&](const std::string& split, uint64_t n) {
    data::ShardInfo s{strf("%s_%06zu.bin", split.c_str(), m.split(split).size()), split, 0, 0, ""};
    data::ShardWriter w(dir + "/" + s.file, data::TokenDtype::kU16);
    while (s.tokens < n) {
      doc.resize(std::min<uint64_t>(1 + rnd() % 2047, n - s.tokens));
      for (auto& t : doc) t = static_cast<uint32_t>(rnd() & 0xFF);
      w.add_document(doc.data(), doc.size());
      s.tokens += doc.size(), ++s.docs;
    }
    s.xxh64 = hex64(w.finish());
    m.shards.push_back(s);
  };
  for (uint64_t done = 0; done < tokens; done += std::min(shard_tokens, tokens - done))
    write("train", std::min(shard_tokens, tokens - done));
  write("val", 100000);
  m.data_version = data::compute_data_version(m.shards, m.tokenizer.hash);
  files::write_file_atomic(dir + "/manifest.json", m.to_json());
  std::cout << strf("{\"generated\": \"%s\", \"train_tokens\": %llu, \"shards\": %zu}\n", dir.c_str(),
                    static_cast<unsigned long long>(tokens), m.shards.size());
}

}  // namespace

// The loader over `data` (sources > 0: a mixture of that many sources, weights 1..N, the i-th reading
// source_dirs[i % size], or `data` when none), and how long opening it took (start-up: manifests,
// shard headers, plan).
std::unique_ptr<lm::data::Loader> open_timed(lm::DataConfig& cfg, const std::string& data, int64_t sources,
                                             const std::vector<std::string>& source_dirs, int64_t seq, int64_t batch,
                                             uint64_t seed, double* startup_s) {
  if (sources > 0) {
    for (int64_t i = 0; i < sources; ++i) {
      lm::SourceConfig sc;
      sc.name = lm::strf("s%lld", static_cast<long long>(i));
      sc.path = source_dirs.empty() ? data : source_dirs[static_cast<size_t>(i) % source_dirs.size()];
      sc.weight = static_cast<double>(i + 1);
      cfg.sources.push_back(sc);
    }
  } else {
    lm::set_train(cfg, data, cfg.text, cfg.text_field);
  }
  const auto t_start = Clock::now();
  const auto d = lm::data::open_train_data(cfg);
  auto loader = std::make_unique<lm::data::Loader>(cfg, d.sources, "train", seq, batch, 0, 1, seed);
  *startup_s = seconds_since(t_start);
  return loader;
}

int main(int argc, char** argv) {
  return lm::run_main("loader_bench", [&] {
    CLI::App app("loader throughput and memory");
    std::string data, generate_dir, mode = "packed";
    int64_t workers = 2, prefetch = 4, seq = 1024, batch = 16, batches = 2000, warmup = 20;
    int64_t budget = 0, sources = 0;
    uint64_t tokens = 0, shard_tokens = 128000000, seed = 1;
    bool memcpy = false;
    lm::DataConfig cfg;
    app.add_option("--data", data, "prepared dataset directory, or its http(s):// or s3:// URL");
    app.add_option("--text", cfg.text, "--data is raw text, one document per: line | paragraph | jsonl");
    app.add_option("--tokenizer", cfg.tokenizer, "--text: bytes | a sentencepiece .model");
    app.add_option("--cache-dir", cfg.cache_dir, "remote --data: the shard cache (--text: the index cache)");
    app.add_option("--cache-mb", cfg.cache_limit_mb, "remote --data: cache limit (MiB)");
    app.add_option("--remote-ahead", cfg.remote_ahead, "remote --data: shards fetched ahead");
    app.add_option("--mode", mode, "packed | bucketed");
    app.add_option("--workers", workers);
    app.add_option("--prefetch", prefetch);
    app.add_option("--seq", seq);
    app.add_option("--batch", batch, "micro batch (rows per batch)");
    app.add_option("--token-budget", budget, "bucketed: padded tokens per batch; 0 = --batch rows");
    app.add_option("--batches", batches, "batches to time");
    app.add_option("--warmup", warmup, "batches before timing");
    app.add_flag("--memcpy", memcpy, "measure memcpy bandwidth too");
    app.add_option("--generate", generate_dir, "write a synthetic dataset here");
    app.add_option("--tokens", tokens, "--generate: train tokens");
    app.add_option("--shard-tokens", shard_tokens, "--generate: tokens per shard");
    app.add_option("--seed", seed);
    app.add_option("--sources", sources, "a mixture of N sources over --data; 0 = data.train");
    std::vector<std::string> source_dirs;
    app.add_option("--source-data", source_dirs, "the mixture's sources read these directories (the i-th the "
                   "i-th, cycling) instead of --data")->delimiter(',');
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);
      throw lm::UsageError(e.what());
    }
    if (!generate_dir.empty()) {
      if (tokens == 0) throw lm::UsageError("--generate needs --tokens");
      generate(generate_dir, tokens, shard_tokens, seed);
      return 0;
    }
    if (data.empty()) {
      if (!memcpy) throw lm::UsageError("give --data DIR, --memcpy or --generate DIR");
      std::cout << lm::strf("{\"memcpy_bytes_per_s\": %.0f}\n", memcpy_bytes_per_s());
      return 0;
    }
    RssSampler rss;
    cfg.mode = mode, cfg.workers = workers, cfg.prefetch = prefetch, cfg.token_budget = budget;
    double startup_s = 0;
    auto loader_ptr = open_timed(cfg, data, sources, source_dirs, seq, batch, seed, &startup_s);
    lm::data::Loader& loader = *loader_ptr;
    for (int64_t i = 0; i < warmup; ++i) loader.next();
    int64_t real = 0, out_bytes = 0;
    double wait_ms = 0;
    const auto t0 = Clock::now();
    for (int64_t i = 0; i < batches; ++i) {
      lm::data::Batch b = loader.next();
      real += b.target_tokens;
      out_bytes += 2 * b.rows * b.cols * static_cast<int64_t>(sizeof(int64_t));
      wait_ms += loader.last_wait_ms();
    }
    const double s = seconds_since(t0);
    rss.sample();
    const long peak_rss = rss.rss, peak_anon = rss.anon, peak_file = rss.file;  // before memcpy's buffers
    std::string extra;
    if (memcpy) extra = lm::strf(", \"memcpy_bytes_per_s\": %.0f", memcpy_bytes_per_s());
    std::cout << lm::strf(
                     "{\"mode\": \"%s\", \"workers\": %lld, \"prefetch\": %lld, \"seq\": %lld, \"batch\": %lld, "
                     "\"token_budget\": %lld, \"batches\": %lld, \"seconds\": %.3f, \"tokens_per_s\": %.0f, "
                     "\"bytes_per_s\": %.0f, \"pad_fraction\": %.4f, \"mean_wait_ms\": %.4f, "
                     "\"peak_vm_rss_kb\": %ld, \"peak_rss_anon_kb\": %ld, \"peak_rss_file_kb\": %ld, \"sources\": %lld, "
                     "\"startup_s\": %.3f%s}",
                     mode.c_str(), static_cast<long long>(workers), static_cast<long long>(prefetch),
                     static_cast<long long>(seq), static_cast<long long>(batch), static_cast<long long>(budget),
                     static_cast<long long>(batches), s, real / s, out_bytes / s,
                     1.0 - real / (out_bytes / 16.0), wait_ms / batches, peak_rss, peak_anon, peak_file,
                     static_cast<long long>(sources), startup_s, extra.c_str())
              << std::endl;
    return 0;
  });
}
