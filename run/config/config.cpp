// YAML file + overrides -> ExperimentConfig (see config.h). describe() below lists every section's
// describe_<section>(): together, every public config key, its type, its allowed values and its one
// description (`trainer --keys`).
#include "run/config/config.h"

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
#include "common/config/schema.h"
#include "common/config/values.h"
#include "run/config/config_yaml.h"

namespace lm {
namespace {

using namespace config_values;
using config_schema::Field;
using config_schema::Schema;
using config_schema::choices_text;

// Where a value came from, for error messages: "configs/x.yaml:12" or "override 'a.b=c'".
using Where = std::string;

// THE list of config keys, in the order config.yaml, the tables and `trainer --keys` print them (a
// run's config.yaml and checkpoints hold this order): each section's keys are described beside the
// struct that owns the section (its describe_<section>()); the defaults live in those structs.
void describe(Schema& s, ExperimentConfig& c) {
  describe_run(s, c.run);                // run/config/train_config.cpp
  describe_data(s, c.data);              // data/loader/data_config.cpp
  describe_model(s, c.model);            // models/model_config.cpp
  describe_optim(s, c.optim);            // run/config/optim_config.cpp
  describe_schedule(s, c.schedule);      // run/config/optim_config.cpp
  describe_train(s, c.train);            // run/config/train_config.cpp
  describe_checkpoint(s, c.checkpoint);  // run/config/checkpoint_config.cpp
  describe_dist(s, c.dist);              // run/config/dist_config.cpp
  describe_log(s, c.log);                // run/config/telemetry_config.cpp
  describe_anomaly(s, c.anomaly);        // run/config/telemetry_config.cpp
  describe_eval(s, c.eval);              // run/config/eval_config.cpp
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

// dist.invariant: what the fixed summation tree covers so far (trainer/parallel/invariant.h).
static void check_invariant(const ExperimentConfig& c) {
  if (!c.dist.invariant) return;
  if (c.data.token_budget > 0)
    throw ConfigError("key 'data.token_budget': dist.invariant needs micro-batches of train.micro_batch_size rows; set "
                      "data.token_budget=0");
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
  if (c.train.bf16_residual && !c.train.bf16())
    throw ConfigError("key 'train.bf16_residual': needs train.dtype=bf16 (it is " + c.train.dtype + ")");
}

// The schedule's rules across keys (after validate(): data.stages are well formed), and wsd's
// anneal_start from the anneal stage. wsd's keys (but at their defaults) and an anneal stage only
// with schedule.kind=wsd; one anneal stage, after a stage that ends at a step; wsd's decay
// (wsd_decay_window) given by decay_steps or decay_fraction (not both), or an anneal stage (its
// start; with one of the two, its length), at least one step long, inside [warmup_steps, max_steps].
void resolve_schedule(ExperimentConfig& c, const Origins& origins) {
  ScheduleConfig& s = c.schedule;
  auto fail = [&](const std::string& key, const std::string& why) {
    const auto it = origins.find(key);
    throw ConfigError((it == origins.end() ? "" : it->second + ": ") + "key '" + key + "': " + why);
  };
  const auto& stages = c.data.stages;
  int64_t anneal = -1;
  size_t anneal_stage = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    if (!stages[i].anneal) continue;
    const std::string who = "stage " + std::to_string(i + 1);
    if (!s.wsd()) fail("data.stages", who + ": anneal needs schedule.kind=wsd (it is " + s.kind + ")");
    if (anneal >= 0)
      fail("data.stages", who + ": only one stage may start the decay (stage " + std::to_string(anneal_stage + 1) +
                              " has anneal: true)");
    if (i > 0 && stages[i - 1].until_step == 0)
      fail("data.stages", who + ": anneal needs the stage before it to end at a step (until), not at a token count "
                                "(until_tokens): the decay's first step must be known before the run");
    anneal = i == 0 ? 0 : stages[i - 1].until_step, anneal_stage = i;
  }
  s.anneal_start = -1;
  if (!s.wsd()) {  // only their defaults (config.yaml writes every key)
    const ScheduleConfig def;
    if (s.decay_shape != def.decay_shape) fail("schedule.decay_shape", "applies to schedule.kind=wsd only (it is " + s.kind + ")");
    if (s.decay_fraction != def.decay_fraction)
      fail("schedule.decay_fraction", "applies to schedule.kind=wsd only (it is " + s.kind + ")");
    return;
  }
  if (s.decay_steps > 0 && s.decay_fraction > 0)
    fail("schedule.decay_fraction", "set either schedule.decay_steps or schedule.decay_fraction, not both");
  if (s.decay_steps <= 0 && s.decay_fraction <= 0 && anneal < 0)
    fail("schedule.kind", "wsd needs the decay placed: schedule.decay_steps, schedule.decay_fraction or a data.stages "
                          "entry with anneal: true");
  s.anneal_start = anneal;
  const int64_t max_steps = c.train.max_steps;
  const DecayWindow d = wsd_decay_window(s, max_steps);
  const std::string range = "steps " + std::to_string(d.start) + "-" + std::to_string(d.end);
  const std::string max_text = "train.max_steps=" + std::to_string(max_steps);
  if (anneal >= 0) {
    if (d.start >= max_steps)
      fail("data.stages", "stage " + std::to_string(anneal_stage + 1) + " starts at step " + std::to_string(d.start) +
                              ", not before " + max_text + ": the decay would never start");
  }
  const std::string len_key = s.decay_steps > 0 ? "schedule.decay_steps" : "schedule.decay_fraction";
  if (anneal >= 0 && d.end > max_steps)
    fail(len_key, "the decay from the anneal stage (" + range + ") ends after " + max_text);
  const std::string by = anneal >= 0 && d.end - d.start >= 1 ? "data.stages" : len_key;
  if (d.end - d.start < 1)
    fail(by, "the decay is " + std::to_string(d.end - d.start) + " steps of " + max_text + "; it needs at least 1");
  if (d.start < 0) fail(by, "the decay (" + std::to_string(d.end - d.start) + " steps) is longer than " + max_text);
  if (d.start < s.warmup_steps)
    fail(by, "the decay (" + range + ") would start inside the warmup (schedule.warmup_steps=" +
                 std::to_string(s.warmup_steps) + ")");
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

}  // namespace

ExperimentConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  ExperimentConfig cfg;
  Schema s;
  describe(s, cfg);
  Origins origins;
  if (!path.empty()) {
    const YAML::Node root = load_yaml_file(path, "config file");
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
  resolve_schedule(cfg, origins);
  resolve_train_form(cfg.data);
  check_invariant(cfg);
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

std::vector<KeyInfo> key_infos() {
  ExperimentConfig def;
  Schema s;
  describe(s, def);
  std::vector<KeyInfo> out;
  for (auto& f : s.fields()) out.push_back({f.key, f.get(), f.allowed, f.doc});
  return out;
}

std::string describe_keys() {
  const auto keys = key_infos();
  // Columns as wide as their widest cell, the default and allowed ones at most 32 (a wider cell,
  // e.g. a long default, pushes the rest of its row).
  size_t wk = 3, wd = 7, wa = 7;
  for (const auto& k : keys) {
    wk = std::max(wk, k.key.size());
    wd = std::max(wd, std::min<size_t>(k.default_value.size(), 32));
    wa = std::max(wa, std::min<size_t>(k.allowed.size(), 32));
  }
  auto cell = [](const std::string& v, size_t w) { return v + std::string(v.size() < w ? w - v.size() + 2 : 2, ' '); };
  std::string out = cell("KEY", wk) + cell("DEFAULT", wd) + cell("ALLOWED", wa) + "DESCRIPTION\n";
  for (const auto& k : keys) out += cell(k.key, wk) + cell(k.default_value, wd) + cell(k.allowed, wa) + k.doc + "\n";
  return out;
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
