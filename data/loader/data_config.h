// Configuration of the training data (YAML section `data:`) and its one validation. Torch-free and
// header-only: the config loader (trainer/config.cpp, linked without lm_data) and the Loader both
// call validate().
#pragma once

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"

namespace lm {

// One source of the training data (data.sources, or data.train's one dataset): a prepared dataset
// or raw text, and its share of the tokens. kSourceFields below is THE list of its keys.
struct SourceConfig {
  std::string name;        // unique; [A-Za-z0-9_.-]+
  std::string path;        // a `prep` output directory, its URL, or raw text
  double weight = 1;       // > 0; relative share of the TOKENS (normalised over the sources)
  int64_t max_epochs = 0;  // > 0: the source drops out after this many epochs; 0 = no cap
  std::string text;        // raw text (data/text/): one document per line | paragraph | jsonl record; "" = prepared
  std::string text_field = "text";  // jsonl: the field holding the text
};

// THE table of a source's keys: the config loader parses (trainer/config_values.cpp), prints and
// documents data.sources entries from it. Exactly one member pointer is set per field.
struct SourceField {
  const char* key;
  const char* doc;
  std::string SourceConfig::*text = nullptr;
  double SourceConfig::*number = nullptr;
  int64_t SourceConfig::*integer = nullptr;
  bool required = false;   // an entry without it is refused
  bool raw_only = false;   // printed only for a raw text source (text set)
};
inline const std::vector<SourceField>& source_fields() {
  static const std::vector<SourceField> f = {
      {"name", "unique name, [A-Za-z0-9_.-]+", &SourceConfig::name, nullptr, nullptr, true},
      {"path", "prep output directory, its http(s):// or s3:// URL, or raw text files", &SourceConfig::path, nullptr,
       nullptr, true},
      {"weight", "share of the tokens (normalised over the sources)", nullptr, &SourceConfig::weight},
      {"max_epochs", "epochs after which the source drops out; 0 = no cap", nullptr, nullptr, &SourceConfig::max_epochs},
      {"text", "raw text: one document per line | paragraph | jsonl; empty = prepared", &SourceConfig::text, nullptr,
       nullptr, false, true},
      {"text_field", "raw text, jsonl: the field holding the text", &SourceConfig::text_field, nullptr, nullptr, false,
       true},
  };
  return f;
}

// One stage of the mixture (data.stages): its weights apply from the previous stage's end until
// `until_step` optimizer steps (or `until_tokens` target tokens) are done; the last stage may leave
// both 0 and runs on (the last stage also runs on past its end).
struct StageConfig {
  int64_t until_step = 0;
  int64_t until_tokens = 0;
  std::vector<std::pair<std::string, double>> weights;  // by source name; an omitted source: 0
};

struct DataConfig {
  // THE training data: the sources, in order. The config loader turns data.train into the one source
  // named "train" (resolve_train_form); below the config there is no other form.
  std::vector<SourceConfig> sources;
  std::vector<StageConfig> stages;    // mixture stages; empty = the sources' weights throughout
  // The sources are data.train's one dataset: planned as one stream exactly as before mixtures
  // existed (loader.h: seeded by run.seed alone, bucketed across batches, no mixture state), and
  // printed back as data.train. Set only by resolve_train_form().
  bool train_form = false;
  std::string val;    // directory (or URL) for validation; empty = the `val` split of the first source

  // data.train's keys as written (the config loader's input; empty after resolve_train_form()).
  std::string train;                 // directory written by `prep`, its http(s):// or s3:// URL, or raw text
  std::string text;                  // raw text in `train`: one document per line | paragraph | jsonl record
  std::string text_field = "text";   // jsonl: the field holding the text

  // Raw text sources (data/text/text_source.h): a source's path is text files that the loader
  // tokenizes, with prep's documents, tokens and split.
  std::string tokenizer = "bytes";   // raw text: bytes | a sentencepiece .model (e.g. a prep output's tokenizer.model)
  double val_fraction = 0.01;        // raw text: share of documents in the val split (as prep --val-fraction)
  int64_t split_seed = 0;            // raw text: seed of the split hash (as prep --split-seed), >= 0

  // The streaming loader (data/loader/loader.h).
  std::string mode = "packed";       // packed: EOS-joined windows of seq_len+1 | bucketed: one document per sample
  int64_t workers = 2;               // threads building batches, in [1, 256]
  int64_t prefetch = 4;              // batches built ahead of the consumer (queue depth), in [1, 1024]
  bool shuffle = true;               // shuffle shard order and samples (else the manifest's order)
  int64_t shuffle_buffer = 4096;     // samples per shuffle block (and per bucketing block), in [1, 2^30]
  std::string long_docs = "truncate";  // bucketed: a document over seq_len+1 tokens is truncated | split
  int64_t pad_multiple = 8;          // bucketed: pad a batch's length up to a multiple of this (1 = none), in [1, 2^20]
  int64_t token_budget = 0;          // bucketed: > 0 = rows per rank chosen so rows*padded_len <= this (>= seq_len)
  std::string verify = "lazy";       // shard checksums: lazy (first open) | full (all at start)
  bool reuse_batch = false;          // benchmark only: every step re-trains the first batches (no reading)
  // The choices as the code asks them (the one place their strings are compared).
  bool bucketed() const { return mode == "bucketed"; }
  bool split_long_docs() const { return long_docs == "split"; }

  // Remote datasets (data/remote/store.h): the local cache and the fault tolerance.
  std::string cache_dir = ".cache/shards";  // shared by every run that names it
  double cache_limit_mb = 10240;     // MiB the cache may hold, > 0
  double remote_timeout_s = 120;     // a fault longer than this ends the run after a checkpoint, > 0
  int64_t remote_ahead = 2;          // shards fetched ahead of the shuffle block in use, in [0, 1024]
};

// The allowed values of the data.* choice keys (validate() and the config schema's choices).
namespace data_choices {
inline const std::vector<std::string> mode = {"packed", "bucketed"};
inline const std::vector<std::string> long_docs = {"truncate", "split"};
inline const std::vector<std::string> verify = {"lazy", "full"};
inline const std::vector<std::string> text = {"", "line", "paragraph", "jsonl"};
}  // namespace data_choices

// data.train (and data.text, data.text_field) as the one-source mixture "train", train_form set;
// a config of data.sources is left as it is. Idempotent. The config loader calls it after
// validate(); tests and tools that build a DataConfig for one dataset call set_train().
inline void resolve_train_form(DataConfig& c) {
  if (c.train.empty()) return;
  SourceConfig s;
  s.name = "train", s.path = c.train, s.text = c.text, s.text_field = c.text_field;
  c.sources = {s};
  c.train_form = true;
  c.train.clear(), c.text.clear(), c.text_field = "text";
}
// One dataset at `path` (prepared, or raw text when `text` is set) as data.train gives it.
inline DataConfig& set_train(DataConfig& c, const std::string& path, const std::string& text = "",
                             const std::string& text_field = "text") {
  c.sources.clear(), c.stages.clear();
  c.train = path, c.text = text, c.text_field = text_field;
  resolve_train_form(c);
  return c;
}

// The data.sources and data.stages rules (part of validate() below).
inline void validate_mixture(const DataConfig& c) {
  auto fail = [](const char* key, const std::string& why) {
    throw ConfigError(std::string("key 'data.") + key + "': " + why);
  };
  if (!c.train.empty() && !c.sources.empty()) fail("sources", "set either data.train or data.sources, not both");
  if (c.train_form && (c.sources.size() != 1 || !c.stages.empty()))
    fail("train", "the data.train form is one source without stages");
  std::set<std::string> names;
  for (const auto& s : c.sources) {
    const std::string who = "source '" + s.name + "'";
    if (s.name.empty() || s.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != std::string::npos)
      fail("sources", "a source name must be [A-Za-z0-9_.-]+, got '" + s.name + "'");
    if (!names.insert(s.name).second) fail("sources", "two sources are named '" + s.name + "'");
    if (s.path.empty()) fail("sources", who + ": path must not be empty");
    if (!(s.weight > 0)) fail("sources", who + ": weight must be > 0, got " + std::to_string(s.weight));
    if (s.max_epochs < 0) fail("sources", who + ": max_epochs must be >= 0, got " + std::to_string(s.max_epochs));
  }
  for (const auto& s : c.sources)
    if (std::find(data_choices::text.begin(), data_choices::text.end(), s.text) == data_choices::text.end())
      fail("sources", "source '" + s.name + "': text must be line, paragraph or jsonl, got '" + s.text + "'");
  if (!c.stages.empty() && c.sources.empty()) fail("stages", "stages need data.sources");
  int64_t last_step = 0, last_tokens = 0;
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const auto& st = c.stages[i];
    const std::string who = "stage " + std::to_string(i + 1);
    if (st.until_step < 0 || st.until_tokens < 0 || (st.until_step > 0 && st.until_tokens > 0))
      fail("stages", who + ": give one of until (steps) or until_tokens, >= 1");
    if (st.until_step == 0 && st.until_tokens == 0 && i + 1 < c.stages.size())
      fail("stages", who + ": only the last stage may omit until");
    if ((st.until_step > 0 && st.until_step <= last_step) || (st.until_tokens > 0 && st.until_tokens <= last_tokens))
      fail("stages", who + ": until must grow from stage to stage");
    last_step = std::max(last_step, st.until_step), last_tokens = std::max(last_tokens, st.until_tokens);
    double sum = 0;
    for (const auto& [name, w] : st.weights) {
      if (!names.count(name)) fail("stages", who + " names unknown source '" + name + "'");
      if (!(w >= 0)) fail("stages", who + ": weight of '" + name + "' must be >= 0, got " + std::to_string(w));
      sum += w;
    }
    if (!(sum > 0)) fail("stages", who + ": the weights must not all be 0");
  }
}

// THE range and choice rules of the data.* keys. Throws ConfigError "key 'data.X': must be ..., got V"
// for the first bad value; `seq_len` is the model's context (token_budget must fit one sample).
inline void validate(const DataConfig& c, int64_t seq_len) {
  auto fail = [](const char* key, const std::string& why) {
    throw ConfigError(std::string("key 'data.") + key + "': " + why);
  };
  auto choice = [&](const char* key, const std::string& v, const std::vector<std::string>& allowed) {
    std::string all;
    for (const auto& a : allowed) {
      if (a == v) return;
      all += (all.empty() ? "" : "|") + a;
    }
    fail(key, "must be one of " + all + ", got '" + v + "'");
  };
  auto range = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {  // hi < 0: no upper bound
    if (v >= lo && (hi < 0 || v <= hi)) return;
    const std::string r = hi < 0 ? ">= " + std::to_string(lo) : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    fail(key, "must be " + r + ", got " + std::to_string(v));
  };
  choice("mode", c.mode, data_choices::mode);
  range("workers", c.workers, 1, 256);
  range("prefetch", c.prefetch, 1, 1024);
  range("shuffle_buffer", c.shuffle_buffer, 1, int64_t{1} << 30);
  choice("long_docs", c.long_docs, data_choices::long_docs);
  range("pad_multiple", c.pad_multiple, 1, int64_t{1} << 20);
  range("token_budget", c.token_budget, 0, -1);
  choice("verify", c.verify, data_choices::verify);
  choice("text", c.text, data_choices::text);
  validate_mixture(c);
  const bool raw = !c.text.empty() || std::any_of(c.sources.begin(), c.sources.end(), [](const SourceConfig& s) { return !s.text.empty(); });
  if (!c.text.empty() && !c.sources.empty()) fail("text", "with data.sources, set text on each source instead");
  if (raw && c.bucketed()) fail("mode", "bucketed is not supported with raw text sources yet (use packed)");
  if (raw && c.tokenizer.empty()) fail("tokenizer", "must name bytes or a sentencepiece .model for raw text");
  if (!(c.val_fraction >= 0 && c.val_fraction <= 1)) fail("val_fraction", "must be in [0, 1], got " + std::to_string(c.val_fraction));
  range("split_seed", c.split_seed, 0, -1);
  if (!(c.cache_limit_mb > 0)) fail("cache_limit_mb", "must be > 0, got " + std::to_string(c.cache_limit_mb));
  range("remote_ahead", c.remote_ahead, 0, 1024);
  if (!(c.remote_timeout_s > 0)) fail("remote_timeout_s", "must be > 0, got " + std::to_string(c.remote_timeout_s));
  if (c.cache_dir.empty()) fail("cache_dir", "must not be empty");
  if (c.bucketed() && c.token_budget > 0 && c.token_budget < seq_len)
    fail("token_budget", "must be >= seq_len (" + std::to_string(seq_len) + ") so that one sample fits, got " +
                             std::to_string(c.token_budget));
}

}  // namespace lm
