// YAML file + overrides -> ExperimentConfig (see config.h). The schema below is the single list of
// every public config key, its type, its range and its one-line meaning.
#include "trainer/config.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

#include "common/errors.h"
#include "common/text.h"
#include "models/registry.h"
#include "trainer/config_values.h"
#include "trainer/telemetry/profiler.h"

namespace lm {
namespace {

using namespace config_values;

// Where a value came from, for error messages: "configs/x.yaml:12" or "override 'a.b=c'".
using Where = std::string;

struct Field {
  std::string key;
  std::string doc;
  // Parses a scalar (or sequence) node into the bound member; throws BadValue on a bad value.
  std::function<void(const YAML::Node&)> set;
  // The current value as YAML text.
  std::function<std::string()> get;
  // JSON type of the value: 'i' integer (-1 = "auto" where allowed), 'n' number, 'b' bool, 's' string,
  // 'y' a structured value (YAML flow text).
  char type = 's';
};

class Schema {
 public:
  void integer(const std::string& key, int64_t* p, const std::string& doc, int64_t lo,
               int64_t hi = std::numeric_limits<int64_t>::max()) {
    add(key, doc, [=](const YAML::Node& n) {
      int64_t v = parse_int(n);
      if (v < lo || v > hi)
        bad("must be " + (hi == std::numeric_limits<int64_t>::max()
                              ? ">= " + std::to_string(lo)
                              : "in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]") +
            ", got " + std::to_string(v));
      *p = v;
    }, [=] { return std::to_string(*p); }, 'i');
  }
  // lo_open: value must be > lo (else >= lo).
  void number(const std::string& key, double* p, const std::string& doc, double lo, bool lo_open,
              double hi = std::numeric_limits<double>::infinity(), bool hi_open = false) {
    add(key, doc, [=](const YAML::Node& n) {
      double v = parse_double(n);
      bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
      if (!ok) {
        std::string r = std::string(lo_open ? "(" : "[") + fmt_double(lo) + ", " +
                        (std::isinf(hi) ? "inf)" : fmt_double(hi) + (hi_open ? ")" : "]"));
        bad("must be in " + r + ", got " + fmt_double(v));
      }
      *p = v;
    }, [=] { return fmt_double(*p); }, 'n');
  }
  // An integer >= lo, or the word "auto" (stored as -1).
  void integer_or_auto(const std::string& key, int64_t* p, const std::string& doc, int64_t lo) {
    add(key, doc, [=](const YAML::Node& n) {
      if (n.IsScalar() && n.Scalar() == "auto") {
        *p = -1;
        return;
      }
      int64_t v;
      try {
        v = parse_int(n);
      } catch (const BadValue&) {
        bad("expected an integer or auto, got '" + scalar_of(n) + "'");
      }
      if (v < lo) bad("must be >= " + std::to_string(lo) + " or auto, got " + std::to_string(v));
      *p = v;
    }, [=] { return *p == -1 ? std::string("auto") : std::to_string(*p); }, 'i');
  }
  void boolean(const std::string& key, bool* p, const std::string& doc) {
    add(key, doc, [=](const YAML::Node& n) { *p = parse_bool(n); },
        [=] { return std::string(*p ? "true" : "false"); }, 'b');
  }
  // shown: the value printed (default: *p).
  void text(const std::string& key, std::string* p, const std::string& doc,
            std::function<std::string()> shown = nullptr) {
    add(key, doc, [=](const YAML::Node& n) { *p = n.IsNull() ? "" : scalar_of(n); },
        [=] { return quote(shown ? shown() : *p); });
  }
  void choice(const std::string& key, std::string* p, const std::string& doc,
              std::vector<std::string> allowed) {
    add(key, doc, [=](const YAML::Node& n) {
      std::string v = scalar_of(n);
      if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
        std::string all;
        for (auto& a : allowed) all += (all.empty() ? "" : "|") + a;
        bad("must be one of " + all + ", got '" + v + "'");
      }
      *p = v;
    }, [=] { return *p; });
  }

  // A structured value (a YAML list of maps) parsed by `parse` and printed back as YAML flow text by
  // `print`; an override gives the same as YAML flow text ("data.sources=[{name: a, path: d}]").
  void structured(const std::string& key, const std::string& doc, std::function<void(const YAML::Node&)> parse,
                  std::function<std::string()> print) {
    add(key, doc, [=](const YAML::Node& n) {
      if (n.IsScalar()) {
        YAML::Node parsed;
        try {
          parsed = YAML::Load(n.Scalar());
        } catch (const YAML::Exception& e) {
          bad("cannot parse '" + n.Scalar() + "': " + e.msg);
        }
        return parse(parsed);
      }
      parse(n);
    }, std::move(print), 'y');
  }

  const Field* find(const std::string& key) const {
    for (auto& f : fields_)
      if (f.key == key) return &f;
    return nullptr;
  }
  const std::vector<Field>& fields() const { return fields_; }
  bool is_section(const std::string& prefix) const {
    for (auto& f : fields_)
      if (f.key.rfind(prefix + ".", 0) == 0) return true;
    return false;
  }

 private:
  void add(const std::string& key, const std::string& doc, std::function<void(const YAML::Node&)> set,
           std::function<std::string()> get, char type = 's') {
    fields_.push_back({key, doc, std::move(set), std::move(get), type});
  }
  std::vector<Field> fields_;
};

// THE list of config keys. Defaults live in the component Config structs.
void describe_training(Schema& s, ExperimentConfig& c);

void describe(Schema& s, ExperimentConfig& c) {
  s.text("run.dir", &c.run.dir, "run directory");
  s.integer("run.seed", &c.run.seed, "seed for init, dropout and data order", 0);
  s.boolean("run.skip_memory_check", &c.run.skip_memory_check, "start even when the memory estimate exceeds what is available");

  // data.*: types and choices only; the data component owns the ranges (lm::validate, data_config.h).
  const int64_t any = std::numeric_limits<int64_t>::min();
  // data.train, data.text and data.text_field become the one source "train" (resolve_train_form)
  // and are printed back from it.
  DataConfig* d = &c.data;
  auto train_key = [d](std::string SourceConfig::*m, const std::string* raw) {
    return [=] { return d->train_form ? d->sources.at(0).*m : *raw; };
  };
  s.text("data.train", &d->train, "prepared dataset directory (from prep), its http(s):// or s3:// URL, or raw text",
         train_key(&SourceConfig::path, &d->train));
  s.structured("data.sources", sources_doc(), [d](const YAML::Node& n) { parse_sources(n, &d->sources); },
               [d] { return print_sources(d->train_form ? std::vector<SourceConfig>{} : d->sources); });
  s.structured("data.stages", "mixture stages: [{until: STEP | until_tokens: N, weights: {name: w}}]",
               [p = &c.data.stages](const YAML::Node& n) { parse_stages(n, p); },
               [p = &c.data.stages] { return print_stages(*p); });
  s.text("data.text", &d->text, "raw text in data.train, one document per: line | paragraph | jsonl; empty = prepared",
         train_key(&SourceConfig::text, &d->text));
  s.text("data.text_field", &d->text_field, "raw text: the JSONL field holding the text",
         train_key(&SourceConfig::text_field, &d->text_field));
  s.text("data.tokenizer", &c.data.tokenizer, "raw text: bytes | a sentencepiece .model file");
  s.number("data.val_fraction", &c.data.val_fraction, "raw text: share of documents in the val split", 0, false, 1, false);
  s.integer("data.split_seed", &c.data.split_seed, "raw text: seed of the document hash deciding the split", 0);
  s.text("data.val", &c.data.val, "validation dataset directory; empty = val split of data.train (or the first source)");
  s.choice("data.mode", &c.data.mode, "packed windows or bucketed documents", data_choices::mode);
  s.integer("data.workers", &c.data.workers, "loader threads building batches", any);
  s.integer("data.prefetch", &c.data.prefetch, "batches built ahead (queue depth)", any);
  s.boolean("data.shuffle", &c.data.shuffle, "shuffle shard order and samples");
  s.integer("data.shuffle_buffer", &c.data.shuffle_buffer, "samples per shuffle/bucketing block", any);
  s.choice("data.long_docs", &c.data.long_docs, "bucketed: documents over seq_len+1 tokens", data_choices::long_docs);
  s.integer("data.pad_multiple", &c.data.pad_multiple, "bucketed: pad length to a multiple of this", any);
  s.integer("data.token_budget", &c.data.token_budget, "bucketed: padded tokens per rank; 0 = micro_batch_size rows", any);
  s.choice("data.verify", &c.data.verify, "shard checksums: on first open or all at start", data_choices::verify);
  s.boolean("data.reuse_batch", &c.data.reuse_batch, "benchmark: reuse the first step's batches (no reading)");
  s.text("data.cache_dir", &c.data.cache_dir, "remote datasets: local shard cache (shared by runs)");
  s.number("data.cache_limit_mb", &c.data.cache_limit_mb, "remote datasets: MiB the cache may hold", 0, true);
  s.number("data.remote_timeout_s", &c.data.remote_timeout_s, "remote datasets: longest fault before the run ends", 0, true);
  s.integer("data.remote_ahead", &c.data.remote_ahead, "remote datasets: shards fetched ahead of the block in use", any);

  s.choice("model.arch", &c.model.arch, "model architecture (models/registry.h)", arch_names());
  s.integer("model.n_layer", &c.model.n_layer, "transformer blocks", 1, 1024);
  s.integer("model.n_head", &c.model.n_head, "attention heads", 1, 1024);
  s.integer("model.d_model", &c.model.d_model, "residual width", 1, 1 << 16);
  s.integer("model.seq_len", &c.model.seq_len, "context length", 1, 1 << 20);
  s.number("model.dropout", &c.model.dropout, "dropout probability", 0, false, 1, true);
  s.integer("model.vocab_size", &c.model.vocab_size, "vocabulary; 0 = from data manifest", 0);
  s.integer("model.vocab_multiple", &c.model.vocab_multiple, "pad vocabulary to a multiple", 1);
  s.number("model.init_std", &c.model.init_std, "std of normal weight init", 0, true);
  s.text("model.init_from", &c.model.init_from, "Hugging Face directory to start from; empty = fresh init");
  s.integer("model.n_kv_head", &c.model.n_kv_head, "llama: key/value heads; 0 = n_head", 0, 1024);
  s.number("model.norm_eps", &c.model.norm_eps, "llama: RMSNorm epsilon", 0, true);
  s.number("model.rope_theta", &c.model.rope_theta, "llama: RoPE base", 0, true);
  s.integer("model.ffn_multiple_of", &c.model.ffn_multiple_of, "llama: SwiGLU width rounded to a multiple", 1);
  s.number("model.ffn_dim_multiplier", &c.model.ffn_dim_multiplier, "llama: SwiGLU width multiplier; 0 = none", 0, false);
  s.boolean("model.tie_embeddings", &c.model.tie_embeddings, "llama: output head shares the token embedding");

  describe_training(s, c);
}

// The optimizer, schedule, training, checkpoint, evaluation and logging keys.
void describe_training(Schema& s, ExperimentConfig& c) {
  s.number("optim.lr", &c.optim.lr, "peak learning rate", 0, true);
  s.number("optim.beta1", &c.optim.beta1, "AdamW beta1", 0, false, 1, true);
  s.number("optim.beta2", &c.optim.beta2, "AdamW beta2", 0, false, 1, true);
  s.number("optim.eps", &c.optim.eps, "AdamW epsilon", 0, true);
  s.number("optim.weight_decay", &c.optim.weight_decay, "decoupled weight decay", 0, false);
  s.number("optim.grad_clip", &c.optim.grad_clip, "max grad norm; 0 = off", 0, false);
  s.choice("optim.fused", &c.optim.fused, "at::_fused_adamw_ gated on the device; auto = on CUDA (CPU: LibTorch >= 2.4)",
           {"auto", "on", "off"});

  s.choice("schedule.kind", &c.schedule.kind, "lr schedule after warmup",
           {"cosine", "linear", "constant"});
  s.integer("schedule.warmup_steps", &c.schedule.warmup_steps, "linear warmup steps", 0);
  s.number("schedule.min_lr_ratio", &c.schedule.min_lr_ratio, "final lr / peak lr", 0, false, 1);
  s.integer("schedule.decay_steps", &c.schedule.decay_steps, "end of decay; 0 = train.max_steps", 0);

  s.integer("train.max_steps", &c.train.max_steps, "optimizer steps", 1);
  s.integer("train.micro_batch_size", &c.train.micro_batch_size, "sequences per micro-batch", 1);
  s.integer("train.grad_accum", &c.train.grad_accum, "micro-batches per step", 1);
  s.integer("train.threads", &c.train.threads, "LibTorch intra-op threads; 0 = 1 on CPU, LibTorch's default on CUDA", 0, 1024);
  s.choice("train.device", &c.train.device, "compute device", {"auto", "cpu", "cuda"});

  s.choice("train.dtype", &c.train.dtype, "compute dtype (bf16: autocast; on CPU LibTorch >= 2.4)", {"fp32", "bf16"});
  s.number("train.ema_decay", &c.train.ema_decay, "EMA of the weights per step; 0 = off", 0, false, 1, true);

  s.integer_or_auto("checkpoint.every_steps", &c.checkpoint.every_steps, "save every N steps; 0 = at the end; auto", 0);
  s.number("checkpoint.mtbf_hours", &c.checkpoint.mtbf_hours, "MTBF per node for every_steps: auto (the job's is this / nodes)", 0, true);
  s.integer("checkpoint.keep_last", &c.checkpoint.keep_last, "newest checkpoints kept; 0 = all", 0);
  s.integer("checkpoint.keep_every", &c.checkpoint.keep_every, "milestone steps never deleted; 0 = none", 0);
  s.text("checkpoint.resume", &c.checkpoint.resume, "auto | none | checkpoint directory");
  s.boolean("checkpoint.force", &c.checkpoint.force, "resume despite architecture/data mismatch");
  s.boolean("checkpoint.async", &c.checkpoint.async, "write checkpoints in the background");
  s.choice("checkpoint.on_error", &c.checkpoint.on_error, "a failed save", {"stop", "continue"});
  s.number("checkpoint.commit_timeout_s", &c.checkpoint.commit_timeout_s, "wait for other ranks' files", 0, true);

  s.choice("dist.backend", &c.dist.backend, "process group backend; auto: gloo/nccl at world size > 1, a named one also at world size 1", {"auto", "nccl", "gloo"});
  s.number("dist.timeout_s", &c.dist.timeout_s, "collective and rendezvous timeout", 0, true);
  s.number("dist.bucket_mb", &c.dist.bucket_mb, "gradient all-reduce bucket size (MB)", 0, true);

  s.integer("log.every_steps", &c.log.every_steps, "log every N steps", 1);
  s.number("log.peak_tflops", &c.log.peak_tflops, "per-device peak TFLOP/s for MFU; 0 = built-in table", 0, false);
  s.number("log.long_window_s", &c.log.long_window_s, "long-window aggregate period (s)", 0, true);
  s.boolean("log.tensorboard", &c.log.tensorboard, "write TensorBoard event files");
  s.text("log.profile_steps", &c.log.profile_steps, "A-B: profile steps A..B (Chrome trace)");

  s.number("anomaly.spike_factor", &c.anomaly.spike_factor, "loss spike: above k x running mean; 0 = off", 0, false);
  s.integer("anomaly.window", &c.anomaly.window, "running-mean window (steps)", 1);
  s.integer("anomaly.warmup_steps", &c.anomaly.warmup_steps, "no spike checks before this step", 0);
  s.choice("anomaly.action", &c.anomaly.action, "on an anomaly", {"continue", "skip", "stop"});
  s.integer("anomaly.max_dumps", &c.anomaly.max_dumps, "anomaly directories written at most", 0);

  s.integer("eval.every_steps", &c.eval.every_steps, "validate every N steps; 0 = at end", 0);
  s.integer("eval.batches", &c.eval.batches, "validation micro-batches; 0 = none", 0);
}

std::string closest_key(const Schema& s, const std::string& key) {
  std::string best;
  size_t best_d = std::numeric_limits<size_t>::max();
  if (key.find('.') == std::string::npos) {  // an unknown section: the closest section
    for (auto& f : s.fields()) {
      std::string sec = f.key.substr(0, f.key.find('.'));
      size_t d = edit_distance(key, sec);
      if (d < best_d) best_d = d, best = sec;
    }
    return best;
  }
  // Compare the whole key, and the leaf alone (so "optim.learning_rate" finds "optim.lr" less
  // well than "train.lr" would find "optim.lr").
  auto leaf = [](const std::string& k) { auto p = k.rfind('.'); return p == std::string::npos ? k : k.substr(p + 1); };
  for (auto& f : s.fields()) {
    size_t d = std::min(edit_distance(key, f.key), edit_distance(leaf(key), leaf(f.key)) + 1);
    if (d < best_d) best_d = d, best = f.key;
  }
  return best;
}

// A key over 256 bytes gets no suggestion (the distances cost |key| x |candidate| each; a hostile
// 40 kB key took seconds, found by tests/fuzz) and is shown cut to its first 80 bytes.
[[noreturn]] void unknown_key(const Schema& s, const std::string& where, const std::string& key) {
  if (key.size() > 256)
    throw ConfigError(where + ": unknown key '" + key.substr(0, 80) + "...' (" + std::to_string(key.size()) + " bytes)");
  throw ConfigError(where + ": unknown key '" + key + "' (did you mean '" + closest_key(s, key) + "'?)");
}

std::string file_where(const std::string& path, const YAML::Node& n) {
  auto m = n.Mark();
  return m.line >= 0 ? path + ":" + std::to_string(m.line + 1) : path;
}

// Where each key's value came from ("FILE:LINE" or "override '...'"), for errors found later.
using Origins = std::map<std::string, std::string>;

void apply(const Schema& s, const std::string& where, const std::string& key, const YAML::Node& n,
           Origins* origins = nullptr) {
  const Field* f = s.find(key);
  if (!f) unknown_key(s, where, key);
  try {
    f->set(n);
  } catch (const BadValue& e) {
    throw ConfigError(where + ": key '" + key + "': " + e.what());
  }
  if (origins) (*origins)[key] = where;
}

// Walks a YAML map, applying leaves as dotted keys.
void walk(const Schema& s, const std::string& path, const std::string& prefix, const YAML::Node& node,
          Origins* origins) {
  std::map<std::string, int> seen;  // key -> line, to refuse duplicates (YAML says keys are unique)
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar())
      throw ConfigError(file_where(path, it->first) + ": a key must be a plain name, not a " +
                        (it->first.IsSequence() ? "list" : it->first.IsMap() ? "map" : "null"));
    std::string name = it->first.Scalar();
    std::string key = prefix.empty() ? name : prefix + "." + name;
    const int line = it->first.Mark().line + 1;
    if (auto [at, fresh] = seen.emplace(name, line); !fresh)
      throw ConfigError(file_where(path, it->first) + ": duplicate key '" + key + "' (first set on line " +
                        std::to_string(at->second) + ")");
    const YAML::Node v = it->second;  // a copy (a handle): it->second lives in a temporary proxy
    if (v.IsMap()) {
      if (s.find(key)) apply(s, file_where(path, it->first), key, v);  // gives "expected a single value"
      if (!s.is_section(key)) unknown_key(s, file_where(path, it->first), key);
      walk(s, path, key, v, origins);
    } else {
      if (!s.find(key) && s.is_section(key))
        throw ConfigError(file_where(path, it->first) + ": key '" + key + "' is a section; expected a map of keys under it");
      apply(s, v.IsNull() ? file_where(path, it->first) : file_where(path, v), key, v, origins);
    }
  }
}

void validate(const ExperimentConfig& c, const Origins& origins) {
  try {
    lm::validate(c.data, c.model.seq_len);
  } catch (const ConfigError& e) {  // "key 'data.X': ...": say where data.X was set
    const std::string msg = e.what();
    const auto q = msg.find('\'', 5);
    auto it = msg.rfind("key '", 0) == 0 && q != std::string::npos ? origins.find(msg.substr(5, q - 5)) : origins.end();
    if (it == origins.end()) throw;
    throw ConfigError(it->second + ": " + msg);
  }
  validate_model(c.model);
  if (c.run.dir.empty()) throw ConfigError("key 'run.dir': must not be empty");
  if (int64_t a = 0, b = 0; !c.log.profile_steps.empty() && !parse_step_range(c.log.profile_steps, &a, &b))
    throw ConfigError("key 'log.profile_steps': expected A-B with 1 <= A <= B, got '" + c.log.profile_steps + "'");
  if (c.checkpoint.resume.empty()) throw ConfigError("key 'checkpoint.resume': must be auto, none or a directory");
}

// A model key the architecture does not read may be set only to its default (so one base file can
// serve both architectures of a sweep); any other value is refused where it was set.
void check_arch_keys(const Schema& s, const ExperimentConfig& c, const Origins& origins) {
  ExperimentConfig def;
  Schema d;
  describe(d, def);
  for (const auto& [key, where] : origins) {
    if (key.rfind("model.", 0) != 0 || arch_uses_key(c.model.arch, key.substr(6))) continue;
    const std::string v = s.find(key)->get(), dv = d.find(key)->get();
    if (v != dv)
      throw ConfigError(where + ": key '" + key + "' does not apply to model.arch=" + c.model.arch +
                        " (only its default, " + dv + ", is accepted)");
  }
}

// Whether the resolved config shows `key`: not the model keys its architecture does not read.
bool shown(const ExperimentConfig& c, const std::string& key) {
  return key.rfind("model.", 0) != 0 || arch_uses_key(c.model.arch, key.substr(6));
}

// The config file's text: a regular file of valid UTF-8 (YAML's encoding), else ConfigError.
std::string read_config_text(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) throw ConfigError(path + ": is a directory, expected a YAML experiment file");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (!in) throw ConfigError(path + ": cannot open config file");
  text << in.rdbuf();  // (an empty file sets failbit: fine)
  const std::string s = text.str();
  if (const size_t at = invalid_utf8_at(s); at != std::string::npos)
    throw ConfigError(path + ":" + std::to_string(1 + std::count(s.begin(), s.begin() + static_cast<ptrdiff_t>(at), '\n')) +
                      ": not valid UTF-8 (byte " + std::to_string(at) + "); YAML files are UTF-8");
  return s;
}

}  // namespace

ExperimentConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  ExperimentConfig cfg;
  Schema s;
  describe(s, cfg);
  Origins origins;
  if (!path.empty()) {
    YAML::Node root;
    const std::string text = read_config_text(path);
    try {
      root = YAML::Load(text);
    } catch (const YAML::ParserException& e) {
      throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
    } catch (const YAML::Exception& e) {
      throw ConfigError(path + ": YAML error: " + e.msg);
    }
    if (root.IsNull()) {
      // empty file: defaults
    } else if (!root.IsMap()) {
      throw ConfigError(file_where(path, root) + ": expected a map of sections at the top level");
    } else {
      try {
        walk(s, path, "", root, &origins);
      } catch (const YAML::Exception& e) {  // e.g. a list or map as a key (found by tests/fuzz)
        throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg + " (keys are plain names)");
      }
    }
  }
  for (const auto& ov : overrides) {
    auto eq = ov.find('=');
    std::string where = "override '" + ov + "'";
    if (eq == std::string::npos || eq == 0)
      throw ConfigError(where + ": expected dotted.key=value");
    std::string key = ov.substr(0, eq), text = ov.substr(eq + 1);
    if (const size_t bad_at = invalid_utf8_at(ov); bad_at != std::string::npos)
      throw ConfigError("override '" + ov.substr(0, bad_at) + "...': not valid UTF-8 at byte " + std::to_string(bad_at));
    // Every key holds one value: the override's text is that value, verbatim (so "a: b" is a
    // string, not a map); an empty value is missing.
    apply(s, where, key, text.empty() ? YAML::Node(YAML::NodeType::Null) : YAML::Node(text), &origins);
  }
  check_arch_keys(s, cfg, origins);
  validate(cfg, origins);
  resolve_train_form(cfg.data);
  return cfg;
}

std::string to_yaml(const ExperimentConfig& cfg_in) {
  ExperimentConfig cfg = cfg_in;
  Schema s;
  describe(s, cfg);
  std::ostringstream out;
  std::string section;
  for (auto& f : s.fields()) {
    if (!shown(cfg, f.key)) continue;
    auto dot = f.key.find('.');
    std::string sec = f.key.substr(0, dot), leaf = f.key.substr(dot + 1);
    if (sec != section) {
      out << sec << ":\n";
      section = sec;
    }
    out << "  " << leaf << ": " << f.get() << "\n";
  }
  return out.str();
}

std::string to_table(const ExperimentConfig& cfg_in) {
  ExperimentConfig cfg = cfg_in, def;
  Schema s, d;
  describe(s, cfg);
  describe(d, def);
  size_t w = 0;
  for (auto& f : s.fields()) w = std::max(w, f.key.size());
  std::ostringstream out;
  for (size_t i = 0; i < s.fields().size(); ++i) {
    auto& f = s.fields()[i];
    if (!shown(cfg, f.key)) continue;
    std::string v = f.get();
    bool changed = v != d.fields()[i].get();
    out << "  " << f.key << std::string(w - f.key.size() + 2, ' ') << (changed ? "* " : "  ") << v << "\n";
  }
  return out.str();
}

namespace {

// A parsed structured value as JSON: maps, lists, and scalars typed as numbers where they read so.
nlohmann::ordered_json yaml_to_json(const YAML::Node& n) {
  if (n.IsSequence()) {
    auto out = nlohmann::ordered_json::array();
    for (const auto& x : n) out.push_back(yaml_to_json(x));
    return out;
  }
  if (n.IsMap()) {
    auto out = nlohmann::ordered_json::object();
    for (auto it = n.begin(); it != n.end(); ++it) out[it->first.as<std::string>()] = yaml_to_json(it->second);
    return out;
  }
  const std::string s = n.IsScalar() ? n.Scalar() : "";
  char* end = nullptr;
  const double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && *end == '\0' && n.Tag() != "!") return d;
  return s;
}

}  // namespace

std::string to_json(const ExperimentConfig& cfg_in) {
  ExperimentConfig cfg = cfg_in;
  Schema s;
  describe(s, cfg);
  nlohmann::ordered_json out = nlohmann::ordered_json::object();
  for (auto& f : s.fields()) {
    if (!shown(cfg, f.key)) continue;
    auto dot = f.key.find('.');
    auto& sec = out[f.key.substr(0, dot)];
    const std::string leaf = f.key.substr(dot + 1), text = f.get();
    switch (f.type) {
      case 'i': sec[leaf] = text == "auto" ? nlohmann::ordered_json("auto") : nlohmann::ordered_json(std::stoll(text)); break;
      case 'n': sec[leaf] = std::strtod(text.c_str(), nullptr); break;
      case 'b': sec[leaf] = text == "true"; break;
      case 'y': sec[leaf] = yaml_to_json(YAML::Load(text)); break;
      default: sec[leaf] = YAML::Load(text).as<std::string>(""); break;
    }
  }
  return out.dump();
}

std::vector<std::string> config_keys() {
  ExperimentConfig cfg;
  Schema s;
  describe(s, cfg);
  std::vector<std::string> keys;
  for (auto& f : s.fields()) keys.push_back(f.key);
  return keys;
}

}  // namespace lm
