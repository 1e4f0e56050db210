// Configuration of the training data (YAML section `data:`) and its one validation (data_config.cpp,
// in lm_data: the config loader, run/config/config.cpp in lm_run, and the Loader both call
// validate()). The data.* keys' descriptions and allowed values are in describe_data
// (data_config.cpp); `trainer --keys` prints them with the defaults below (data.sources' entries:
// source_fields()).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "data/remote/store.h"

namespace lm {
namespace config_schema {
class Schema;
}

// One source of the training data (data.sources, or data.train's one dataset): a prepared dataset
// or raw text, and its share of the tokens. source_fields() below is THE list of its keys.
struct SourceConfig {
  std::string name;
  std::string path;
  double weight = 1;
  int64_t max_epochs = 0;
  std::string text;
  std::string text_field = "text";
};

// THE table of a source's keys: describe_data parses, prints and documents data.sources entries
// from it. Exactly one member pointer is set per field.
struct SourceField {
  const char* key;
  const char* doc;
  std::string SourceConfig::*text = nullptr;
  double SourceConfig::*number = nullptr;
  int64_t SourceConfig::*integer = nullptr;
  bool required = false;   // an entry without it is refused
  bool raw_only = false;   // printed only for a raw text source (text set)
};
const std::vector<SourceField>& source_fields();

// One stage of the mixture (data.stages): its weights apply from the previous stage's end until
// `until_step` optimizer steps (or `until_tokens` target tokens) are done; the last stage may leave
// both 0 and runs on (the last stage also runs on past its end).
struct StageConfig {
  int64_t until_step = 0;
  int64_t until_tokens = 0;
  std::vector<std::pair<std::string, double>> weights;  // by source name; an omitted source: 0
  // The learning rate's decay (schedule.kind wsd) starts at this stage's first step; the loader
  // does not read it (the config loader turns it into ScheduleConfig::anneal_start).
  bool anneal = false;
};

struct DataConfig {
  // THE training data: the sources, in order. The config loader turns data.train into the one source
  // named "train" (resolve_train_form); below the config there is no other form.
  std::vector<SourceConfig> sources;
  std::vector<StageConfig> stages;
  // The sources are data.train's one dataset: planned as one stream exactly as before mixtures
  // existed (loader.h: seeded by run.seed alone, bucketed across batches, no mixture state), and
  // printed back as data.train. Set only by resolve_train_form(); below the config only data_form()
  // (data/loader/form.h) reads it.
  bool train_form = false;
  std::string val;

  // data.train's keys as written (the config loader's input; empty after resolve_train_form()).
  std::string train;
  std::string text;
  std::string text_field = "text";

  // Raw text sources (data/text/text_source.h): a source's path is text files that the loader
  // tokenizes, with prep's documents, tokens and split.
  std::string tokenizer = "bytes";
  double val_fraction = 0.01;
  int64_t split_seed = 0;

  // The streaming loader (data/loader/loader.h).
  std::string mode = "packed";
  int64_t workers = 2;
  int64_t prefetch = 4;
  bool shuffle = true;
  int64_t shuffle_buffer = 4096;
  std::string long_docs = "truncate";
  int64_t pad_multiple = 8;
  int64_t token_budget = 0;
  std::string verify = "lazy";
  bool reuse_batch = false;
  // The model keeps a packed window's documents apart (models/lm.h: DocMask); the loader's batches
  // are the same either way.
  bool doc_mask = false;
  // The choices as the code asks them (the one place their strings are compared).
  bool bucketed() const { return mode == "bucketed"; }
  bool split_long_docs() const { return long_docs == "split"; }
  bool verify_full() const { return verify == "full"; }

  // Remote datasets (data/remote/store.h): the local cache and the fault tolerance.
  std::string cache_dir = ".cache/shards";
  double cache_limit_mb = 10240;
  double remote_timeout_s = 120;
  int64_t remote_ahead = 2;
};

namespace data {
// The remote store's options (data/remote/store.h) from the data: section.
inline RemoteOptions remote_options(const DataConfig& c) {
  return {c.cache_dir, static_cast<uint64_t>(c.cache_limit_mb * (1 << 20)), c.remote_timeout_s};
}
}  // namespace data

// The allowed values of the data.* choice keys (validate() and the config schema's choices).
namespace data_choices {
inline const std::vector<std::string> mode = {"packed", "bucketed"};
inline const std::vector<std::string> long_docs = {"truncate", "split"};
inline const std::vector<std::string> verify = {"lazy", "full"};
inline const std::vector<std::string> text = {"", "line", "paragraph", "jsonl"};
}  // namespace data_choices

// The ranges of the data.* integer keys (validate() and the config schema's allowed values).
struct IntRange {
  int64_t lo, hi;  // hi < 0: no upper bound
};
namespace data_ranges {
constexpr IntRange workers{1, 256}, prefetch{1, 1024}, shuffle_buffer{1, int64_t{1} << 30},
    pad_multiple{1, int64_t{1} << 20}, token_budget{0, -1}, split_seed{0, -1}, remote_ahead{0, 1024};
}  // namespace data_ranges

// data.train (and data.text, data.text_field) as the one-source mixture "train", train_form set;
// a config of data.sources is left as it is. Idempotent. The config loader calls it after
// validate(); tests and tools that build a DataConfig for one dataset call set_train().
void resolve_train_form(DataConfig& c);
// One dataset at `path` (prepared, or raw text when `text` is set) as data.train gives it.
DataConfig& set_train(DataConfig& c, const std::string& path, const std::string& text = "",
                      const std::string& text_field = "text");

// The data.sources and data.stages rules (part of validate() below).
void validate_mixture(const DataConfig& c);

// THE range and choice rules of the data.* keys. Throws ConfigError "key 'data.X': must be ..., got V"
// for the first bad value; `seq_len` is the model's context (token_budget must fit one sample).
void validate(const DataConfig& c, int64_t seq_len);

// The data.* keys into the config schema (run/config/config.cpp's describe()): each one's type,
// allowed values and its one description.
void describe_data(config_schema::Schema& s, DataConfig& d);

}  // namespace lm
