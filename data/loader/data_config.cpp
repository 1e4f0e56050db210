// The data: section's source table, its one-source form and its one validation (see data_config.h).
#include "data/loader/data_config.h"

#include <algorithm>
#include <set>

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

}  // namespace lm
