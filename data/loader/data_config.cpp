// The data: section's keys (describe_data: each one's type, allowed values and its one description,
// printed by `trainer --keys` and docs/config.md), its source table, its one-source form and its one
// validation (see data_config.h).
#include "data/loader/data_config.h"

#include <algorithm>
#include <set>

#include "common/config/schema.h"
#include "common/config/values.h"
#include "common/errors.h"

namespace lm {

const std::vector<SourceField>& source_fields() {
  static const std::vector<SourceField> f = {
      {"name", "unique name, [A-Za-z0-9_.-]+", &SourceConfig::name, nullptr, nullptr, true},
      {"path", "prep output directory, its http(s):// or s3:// URL, or raw text files", &SourceConfig::path, nullptr,
       nullptr, true},
      {"weight", "share of the tokens, > 0 (normalised over the sources)", nullptr, &SourceConfig::weight},
      {"max_epochs", "epochs after which the source drops out; 0 = no cap", nullptr, nullptr, &SourceConfig::max_epochs},
      {"text", "raw text: one document per line | paragraph | jsonl; empty = prepared", &SourceConfig::text, nullptr,
       nullptr, false, true},
      {"text_field", "raw text, jsonl: the field holding the text", &SourceConfig::text_field, nullptr, nullptr, false,
       true},
  };
  return f;
}

void resolve_train_form(DataConfig& c) {
  if (c.train.empty()) return;
  SourceConfig s;
  s.name = "train", s.path = c.train, s.text = c.text, s.text_field = c.text_field;
  c.sources = {s};
  c.train_form = true;
  c.train.clear(), c.text.clear(), c.text_field = "text";
}

DataConfig& set_train(DataConfig& c, const std::string& path, const std::string& text, const std::string& text_field) {
  c.sources.clear(), c.stages.clear();
  c.train = path, c.text = text, c.text_field = text_field;
  resolve_train_form(c);
  return c;
}

void validate_mixture(const DataConfig& c) {
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

void validate(const DataConfig& c, int64_t seq_len) {
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
  auto range = [&](const char* key, int64_t v, IntRange range_of) {
    const int64_t lo = range_of.lo, hi = range_of.hi;
    if (v >= lo && (hi < 0 || v <= hi)) return;
    const std::string r = hi < 0 ? ">= " + std::to_string(lo) : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
    fail(key, "must be " + r + ", got " + std::to_string(v));
  };
  choice("mode", c.mode, data_choices::mode);
  range("workers", c.workers, data_ranges::workers);
  range("prefetch", c.prefetch, data_ranges::prefetch);
  range("shuffle_buffer", c.shuffle_buffer, data_ranges::shuffle_buffer);
  choice("long_docs", c.long_docs, data_choices::long_docs);
  range("pad_multiple", c.pad_multiple, data_ranges::pad_multiple);
  range("token_budget", c.token_budget, data_ranges::token_budget);
  choice("verify", c.verify, data_choices::verify);
  choice("text", c.text, data_choices::text);
  validate_mixture(c);
  const bool raw = !c.text.empty() || std::any_of(c.sources.begin(), c.sources.end(), [](const SourceConfig& s) { return !s.text.empty(); });
  if (!c.text.empty() && !c.sources.empty()) fail("text", "with data.sources, set text on each source instead");
  if (raw && c.bucketed()) fail("mode", "bucketed is not supported with raw text sources yet (use packed)");
  if (raw && c.tokenizer.empty()) fail("tokenizer", "must name bytes or a sentencepiece .model for raw text");
  if (!(c.val_fraction >= 0 && c.val_fraction <= 1)) fail("val_fraction", "must be in [0, 1], got " + std::to_string(c.val_fraction));
  range("split_seed", c.split_seed, data_ranges::split_seed);
  if (!(c.cache_limit_mb > 0)) fail("cache_limit_mb", "must be > 0, got " + std::to_string(c.cache_limit_mb));
  range("remote_ahead", c.remote_ahead, data_ranges::remote_ahead);
  if (!(c.remote_timeout_s > 0)) fail("remote_timeout_s", "must be > 0, got " + std::to_string(c.remote_timeout_s));
  if (c.cache_dir.empty()) fail("cache_dir", "must not be empty");
  if (c.doc_mask && c.bucketed())
    fail("doc_mask", "applies to data.mode=packed only (a bucketed row is one document already)");
  if (c.bucketed() && c.token_budget > 0 && c.token_budget < seq_len)
    fail("token_budget", "must be >= seq_len (" + std::to_string(seq_len) + ") so that one sample fits, got " +
                             std::to_string(c.token_budget));
}

// data.sources and data.stages: their YAML lists to structs and back (a named namespace: the folder
// is one translation unit, see lm_unity_groups, so its using-directive stays here).
namespace data_keys {

using namespace config_values;

void parse_sources(const YAML::Node& n, std::vector<SourceConfig>* out) {
  out->clear();
  const YAML::Node& list = list_of(n);
  std::vector<std::string> keys;
  for (const auto& f : source_fields()) keys.push_back(f.key);
  for (size_t i = 0; i < list.size(); ++i) {
    SourceConfig s;
    each_key(i, list[i], keys, [&](const std::string& k, const YAML::Node& v) {
      const SourceField& f = *std::find_if(source_fields().begin(), source_fields().end(),
                                           [&](const SourceField& x) { return k == x.key; });
      if (f.text) s.*f.text = scalar_of(v);
      if (f.number) s.*f.number = parse_double(v);
      if (f.integer) s.*f.integer = parse_int(v);
    });
    for (const auto& f : source_fields())
      if (f.required && f.text && (s.*f.text).empty()) bad(entry_where(i, list[i]) + ": needs a name and a path");
    out->push_back(s);
  }
}

void parse_stages(const YAML::Node& n, std::vector<StageConfig>* out) {
  out->clear();
  const YAML::Node& list = list_of(n);
  for (size_t i = 0; i < list.size(); ++i) {
    StageConfig s;
    each_key(i, list[i], {"until", "until_tokens", "weights", "anneal"}, [&](const std::string& k, const YAML::Node& v) {
      if (k == "until") s.until_step = parse_int(v);
      if (k == "until_tokens") s.until_tokens = parse_int(v);
      if (k == "anneal") s.anneal = parse_bool(v);
      if (k != "weights") return;
      if (!v.IsMap()) bad("expected a map of source name: weight");
      for (auto it = v.begin(); it != v.end(); ++it) s.weights.emplace_back(it->first.as<std::string>(), parse_double(it->second));
    });
    out->push_back(s);
  }
}

std::string print_sources(const std::vector<SourceConfig>& v) {
  std::string out;
  for (const auto& s : v) {
    std::string one;
    for (const auto& f : source_fields()) {
      if (f.raw_only && s.text.empty()) continue;
      const std::string value = f.text ? quote(s.*f.text) : f.number ? fmt_double(s.*f.number) : std::to_string(s.*f.integer);
      one += (one.empty() ? "" : ", ") + std::string(f.key) + ": " + value;
    }
    out += (out.empty() ? "{" : ", {") + one + "}";
  }
  return "[" + out + "]";
}

// "[{name, path, ...}]: name: ...; path: ...": data.sources' documentation, from the same table.
std::string sources_doc() {
  std::string keys, docs;
  for (const auto& f : source_fields()) {
    keys += (keys.empty() ? "" : ", ") + std::string(f.key);
    docs += std::string("; ") + f.key + ": " + f.doc;
  }
  return "a mixture instead of data.train: [{" + keys + "}]" + docs;
}

std::string print_stages(const std::vector<StageConfig>& v) {
  std::string out;
  for (const auto& s : v) {
    std::string w;
    for (const auto& [name, x] : s.weights) w += (w.empty() ? "" : ", ") + quote(name) + ": " + fmt_double(x);
    out += (out.empty() ? "" : ", ") + std::string("{") +
           (s.until_tokens > 0 ? "until_tokens: " + std::to_string(s.until_tokens) : "until: " + std::to_string(s.until_step)) +
           ", weights: {" + w + "}" + (s.anneal ? ", anneal: true" : "") + "}";
  }
  return "[" + out + "]";
}

}  // namespace data_keys

void describe_data(config_schema::Schema& s, DataConfig& d) {
  using config_schema::Schema;
  using config_schema::choices_text;
  using namespace data_keys;
  // data.*: the parser checks types and choices; the data component owns the ranges (lm::validate,
  // data_config.cpp, from data_ranges), shown here through integer_checked_later.
  auto later = [&s](const std::string& key, int64_t* p, const std::string& doc, IntRange r) {
    s.integer_checked_later(key, p, doc, r.lo, r.hi < 0 ? Schema::kNoMax : r.hi);
  };
  // data.train, data.text and data.text_field become the one source "train" (resolve_train_form)
  // and are printed back from it.
  DataConfig* dp = &d;
  auto train_key = [dp](std::string SourceConfig::*m, const std::string* raw) {
    return [=] { return dp->train_form ? dp->sources.at(0).*m : *raw; };
  };
  s.text("data.train", &d.train, "the training data: a prep output directory, its http(s):// or s3:// URL, or raw text "
         "files (data.text); or use data.sources", "path or URL", train_key(&SourceConfig::path, &d.train));
  s.structured("data.sources", sources_doc(), "list of maps",
               [dp](const YAML::Node& n) { parse_sources(n, &dp->sources); },
               [dp] { return print_sources(dp->train_form ? std::vector<SourceConfig>{} : dp->sources); });
  s.structured("data.stages", "mixture stages: [{until: STEP | until_tokens: N, weights: {name: w}, anneal: "
               "false}]; empty = the sources' weights throughout; anneal: true (schedule.kind wsd, one stage, after a "
               "stage ending at a step): the lr's decay starts at the stage's first step", "list of maps",
               [dp](const YAML::Node& n) { parse_stages(n, &dp->stages); }, [dp] { return print_stages(dp->stages); });
  s.text("data.text", &d.text, "raw text in data.train: one document per line, paragraph or jsonl record; empty = a "
         "prepared dataset", choices_text(data_choices::text), train_key(&SourceConfig::text, &d.text));
  s.text("data.text_field", &d.text_field, "raw text, jsonl: the field holding the text", "field name",
         train_key(&SourceConfig::text_field, &d.text_field));
  s.text("data.tokenizer", &d.tokenizer, "raw text: bytes, or a sentencepiece .model file (e.g. a prep output's "
         "tokenizer.model)", "bytes or path");
  s.number("data.val_fraction", &d.val_fraction, "raw text: share of documents in the val split (as prep --val-fraction)",
           0, false, 1, false);
  s.integer("data.split_seed", &d.split_seed, "raw text: seed of the document hash deciding the split (as prep "
            "--split-seed)", data_ranges::split_seed.lo);
  s.text("data.val", &d.val, "validation dataset directory or URL; empty = the val split of data.train (or of the "
         "first source)", "path or URL");
  s.choice("data.mode", &d.mode, "packed: EOS-joined windows of model.seq_len+1 tokens; bucketed: one document per "
           "sample, in padded batches", data_choices::mode);
  later("data.workers", &d.workers, "loader threads building batches", data_ranges::workers);
  later("data.prefetch", &d.prefetch, "batches built ahead of the training loop (queue depth)", data_ranges::prefetch);
  s.boolean("data.shuffle", &d.shuffle, "shuffle shard order and samples (else the manifest's order)");
  later("data.shuffle_buffer", &d.shuffle_buffer, "samples per shuffle block (and per bucketing block)",
        data_ranges::shuffle_buffer);
  s.choice("data.long_docs", &d.long_docs, "bucketed: a document over model.seq_len+1 tokens is truncated or split",
           data_choices::long_docs);
  later("data.pad_multiple", &d.pad_multiple, "bucketed: a batch's length is padded up to a multiple of this; "
        "1 = no padding", data_ranges::pad_multiple);
  later("data.token_budget", &d.token_budget, "bucketed: padded tokens per rank, rows chosen so that rows x padded "
        "length <= this (at least model.seq_len); 0 = train.micro_batch_size rows", data_ranges::token_budget);
  s.choice("data.verify", &d.verify, "shard checksums: lazy = each shard on its first open, full = all at start",
           data_choices::verify);
  s.boolean("data.reuse_batch", &d.reuse_batch, "benchmark only: every step re-trains the first step's batches (no reading)");
  s.boolean("data.doc_mask", &d.doc_mask, "packed: attention never crosses a document boundary (an EOS token ends its "
            "document) and positions (gpt's learned ones, llama's RoPE) restart at each document; validation too; "
            "refused with data.mode=bucketed (a row is one document)");
  s.text("data.cache_dir", &d.cache_dir, "remote datasets: the local shard cache, shared by every run that names it",
         "non-empty path");
  s.number("data.cache_limit_mb", &d.cache_limit_mb, "remote datasets: MiB the shard cache may hold", 0, true);
  s.number("data.remote_timeout_s", &d.remote_timeout_s, "remote datasets: seconds a fault may last before the run "
           "ends (after a checkpoint)", 0, true);
  later("data.remote_ahead", &d.remote_ahead, "remote datasets: shards fetched ahead of the shuffle block in use",
        data_ranges::remote_ahead);
}

}  // namespace lm
