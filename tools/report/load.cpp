// Reading a run directory into a Run (see load.h).
#include "tools/report/load.h"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <stdexcept>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "run/config/config_yaml.h"
#include "run/run_dir.h"
#include "run/records.h"

namespace lm::report {
namespace {

namespace rec = records;

// The fields of train and val records kept as series (charts and the runs table read them).
constexpr const char* kTrainSeries[] = {rec::kLoss,        rec::kLr,       rec::kGradNorm, rec::kTokensPerS,
                                        rec::kTokensPerSRank, rec::kDataWaitPct, rec::kMfuPct, rec::kMemMb,
                                        rec::kPaddingPct,  rec::kStepMs,   rec::kTokens,   rec::kEpoch};
constexpr const char* kValSeries[] = {rec::kValLoss, rec::kValLossEma};

// A finite number at j[key] into *out; false when missing, null, not a number or not finite.
bool number(const json& j, const char* key, double* out) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return false;
  *out = it->get<double>();
  return std::isfinite(*out);
}

// Appends, replacing points at or after `step` (a rewound timeline logs them again).
void add_point(Series& s, double step, double v) {
  while (!s.empty() && s.back().step >= step) s.pop_back();
  s.push_back({step, v});
}

// "resumed from CHECKPOINT (recovery N ms, load M ms)", as much as the record tells.
std::string resume_text(const json& j) {
  double v = 0;
  std::string text = "resumed";
  if (auto c = j.find(rec::kCheckpointDir); c != j.end() && c->is_string()) text += " from " + c->get<std::string>();
  std::string times;
  if (number(j, rec::kRecoveryMs, &v)) times += strf("recovery %.0f ms", v);
  if (number(j, rec::kLoadMs, &v)) times += strf("%sload %.0f ms", times.empty() ? "" : ", ", v);
  if (!times.empty()) text += " (" + times + ")";
  return text;
}

// "REASON (key=value, ...)" with the anomaly record's other fields.
std::string anomaly_text(const json& j) {
  std::string text;
  if (auto c = j.find(rec::kReason); c != j.end()) text = compact(*c);
  std::string rest;
  for (auto& [key, val] : j.items())
    if (key != rec::kKind && key != rec::kStep && key != rec::kReason && key != rec::kTime)
      rest += (rest.empty() ? "" : ", ") + key + "=" + compact(val);
  if (!rest.empty()) text += (text.empty() ? "" : " (") + rest + (text.empty() ? "" : ")");
  return text;
}

// One record of kind `kind` at `step` into the run.
void add_record(Run& r, const json& j, const std::string& kind, double step) {
  double v = 0;
  if (kind == rec::kTrain) {
    for (const char* f : kTrainSeries)
      if (number(j, f, &v)) add_point(r.series[f], step, v);
    if (auto m = j.find(rec::kSourceTokens); m != j.end() && m->is_object())
      for (auto& [name, t] : m->items())
        if (t.is_number()) add_point(r.source_tokens[name], step, t.get<double>());
  } else if (kind == rec::kVal) {
    for (const char* f : kValSeries)
      if (number(j, f, &v)) add_point(r.series[f], step, v);
  } else if (kind == rec::kTask) {  // series "task_acc/NAME" and "task_acc_norm/NAME"
    auto n = j.find(rec::kTaskName);
    if (n == j.end() || !n->is_string() || n->get<std::string>().empty()) {
      ++r.ignored["task without a name"];
      return;
    }
    for (const char* f : {rec::kTaskAcc, rec::kTaskAccNorm})
      if (number(j, f, &v)) add_point(r.series[task_series(f, n->get<std::string>())], step, v);
  } else if (kind == rec::kCheckpoint) {
    if (number(j, rec::kCkptBlockMs, &v)) r.ckpt_block_ms.push_back(v);
    if (number(j, rec::kCkptMbPerS, &v) && v > 0) r.ckpt_mb_per_s.push_back(v);
    if (number(j, rec::kCkptMb, &v)) r.ckpt_mb = v;
  } else if (kind == rec::kResume) {
    for (auto* m : {&r.series, &r.source_tokens})
      for (auto& [name, s] : *m)
        while (!s.empty() && s.back().step > step) s.pop_back();
    r.events.push_back({step, rec::kResume, resume_text(j)});
  } else if (kind == rec::kAnomaly) {
    r.events.push_back({step, rec::kAnomaly, anomaly_text(j)});
  } else {
    ++r.ignored[kind.empty() ? "(no kind)" : kind];
  }
}

void load_metrics(Run& r, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(path + ": cannot open for reading");
  std::string line;
  int64_t no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      if (++r.bad_lines <= 5) r.bad_line_numbers.push_back(no);
      continue;
    }
    auto k = j.find(rec::kKind);
    const std::string kind = k != j.end() && k->is_string() ? k->get<std::string>() : "";
    double step = 0;
    if (!number(j, rec::kStep, &step)) {
      ++r.ignored[(kind.empty() ? "(no kind)" : kind) + " without step"];
      continue;
    }
    add_record(r, j, kind, step);
  }
}

std::string yaml_text(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  if (n.IsNull() || !n.IsDefined()) return "null";
  YAML::Emitter e;
  e.SetMapFormat(YAML::Flow);
  e.SetSeqFormat(YAML::Flow);
  e << n;
  return e.c_str();
}

// Maps flatten to dotted keys; other values (sequences too) become one flow-style value.
void flatten_yaml(const YAML::Node& n, const std::string& prefix, KV& out) {
  if (n.IsMap() && n.size() > 0) {
    for (auto it : n) {
      const std::string key = it.first.as<std::string>();
      flatten_yaml(it.second, prefix.empty() ? key : prefix + "." + key, out);
    }
  } else if (!prefix.empty()) {
    out.emplace_back(prefix, yaml_text(n));
  }
}

// Objects flatten to dotted keys, arrays of objects to "key.INDEX.field" (meta.json's attempts);
// other arrays stay one JSON value. The key `skip` (and what is under it) is left out.
void flatten_json(const json& j, const std::string& prefix, KV& out, const std::string& skip = "") {
  if (j.is_object() && !j.empty()) {
    for (auto& [key, val] : j.items()) {
      const std::string k = prefix.empty() ? key : prefix + "." + key;
      if (k != skip) flatten_json(val, k, out);
    }
  } else if (j.is_array() && !j.empty() && std::all_of(j.begin(), j.end(), [](const json& e) { return e.is_object(); })) {
    for (size_t i = 0; i < j.size(); ++i) flatten_json(j[i], prefix + "." + std::to_string(i), out);
  } else if (!prefix.empty()) {
    out.emplace_back(prefix, compact(j));
  }
}

std::string trim_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

// The last path component; "." and ".." (also as the last component) resolved to a real name.
std::string base_name(const std::string& path) {
  std::string p = trim_slashes(path);
  if (p == "." || p == ".." || p.empty() || (p.size() >= 3 && p.compare(p.size() - 3, 3, "/..") == 0) ||
      (p.size() >= 2 && p.compare(p.size() - 2, 2, "/.") == 0)) {
    char buf[PATH_MAX];
    if (::realpath(p.empty() ? "." : p.c_str(), buf)) p = buf;
  }
  auto s = p.find_last_of('/');
  return s == std::string::npos || p.size() == 1 ? p : p.substr(s + 1);
}

// meta.json, its config copy left out (the config table shows the config).
void load_meta(Run& r) {
  const std::string path = run_dir::meta(r.dir);
  if (!files::exists(path)) return;
  try {
    r.meta_json = json::parse(files::read_file(path));
    if (!r.meta_json.is_object()) throw std::runtime_error("not a JSON object");
    r.has_meta = true;
    flatten_json(r.meta_json, "", r.meta, "config");
  } catch (const std::exception& e) {
    r.meta_json = nullptr;
    r.notes.push_back("meta.json unreadable: " + std::string(e.what()));
  }
}

// config.yaml; without it, meta.json's copy of the config.
void load_config(Run& r) {
  const std::string path = run_dir::config(r.dir);
  if (files::exists(path)) {
    try {
      flatten_yaml(load_yaml_file(path, "config file"), "", r.config);
      r.has_config = true;
    } catch (const std::exception& e) {
      r.config.clear();
      r.notes.push_back("config.yaml unreadable: " + std::string(e.what()));
    }
  }
  if (!r.has_config && r.has_meta && r.meta_json.contains("config")) {
    flatten_json(r.meta_json["config"], "", r.config);
    r.has_config = true;
    r.notes.push_back("no config.yaml: config taken from meta.json");
  }
}

// summary.json; an unreadable one counts as absent.
void load_summary(Run& r) {
  const std::string path = run_dir::summary(r.dir);
  if (!files::exists(path)) return;
  try {
    r.summary_json = json::parse(files::read_file(path));
  } catch (const std::exception&) {
    r.summary_json = nullptr;
  }
}

// The notes shown under the runs table: how the run ended and what was not read.
void add_notes(Run& r) {
  if (r.has_meta) {
    if (auto e = r.meta_json.find("error"); e != r.meta_json.end() && e->is_string() && !e->get<std::string>().empty())
      r.notes.push_back("meta.json error: " + e->get<std::string>());
    if (auto a = r.meta_json.find("attempts"); a != r.meta_json.end() && a->is_array() && !a->empty())
      r.notes.push_back(strf("%zu earlier attempt%s in this directory (see meta: attempts)", a->size(), a->size() == 1 ? "" : "s"));
  }
  if (r.bad_lines > 0) {
    std::string nos;
    for (auto n : r.bad_line_numbers) nos += (nos.empty() ? "" : ", ") + std::to_string(n);
    r.notes.push_back(strf("%lld malformed line%s in metrics.jsonl skipped (line%s %s%s)", (long long)r.bad_lines,
                           r.bad_lines == 1 ? "" : "s", r.bad_line_numbers.size() == 1 ? "" : "s", nos.c_str(),
                           r.bad_lines > (int64_t)r.bad_line_numbers.size() ? ", ..." : ""));
  }
  if (!r.ignored.empty()) {
    std::string kinds;
    for (auto& [k, n] : r.ignored) kinds += (kinds.empty() ? "" : ", ") + k + strf(" \xC3\x97%lld", (long long)n);
    r.notes.push_back("records not charted: " + kinds);
  }
  if (!r.has_config && !files::exists(run_dir::config(r.dir))) r.notes.push_back("no config.yaml");
  if (!last_point(r, rec::kLoss) && !last_point(r, rec::kValLoss)) r.notes.push_back("no train or val records in metrics.jsonl");
  if (!r.has_meta && !files::exists(run_dir::meta(r.dir))) r.notes.push_back("no meta.json");
}

}  // namespace

Run load_run(const std::string& dir) {
  Run r;
  r.dir = trim_slashes(dir);
  r.name = base_name(dir);
  if (!is_dir(r.dir)) throw DataError(dir + ": no such run directory");
  const std::string metrics = run_dir::metrics(r.dir);
  if (!files::exists(metrics)) throw DataError(dir + ": no metrics.jsonl (not a run directory?)");
  load_metrics(r, metrics);
  load_meta(r);
  load_config(r);
  load_summary(r);
  add_notes(r);
  return r;
}

void name_runs(std::vector<Run>& runs) {
  std::map<std::string, int> count;
  for (auto& r : runs) ++count[r.name];
  for (auto& r : runs) {
    if (count[r.name] < 2) continue;
    const std::string parent = r.dir.find('/') == std::string::npos ? "" : r.dir.substr(0, r.dir.find_last_of('/'));
    if (!parent.empty()) r.name = base_name(parent) + "/" + r.name;
  }
  std::map<std::string, int> seen;
  for (auto& r : runs)
    if (int n = ++seen[r.name]; n > 1) r.name += " (" + std::to_string(n) + ")";
}

const std::string* kv_find(const KV& kv, const std::string& key) {
  for (auto& [k, v] : kv)
    if (k == key) return &v;
  return nullptr;
}

std::string compact(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) return std::to_string(static_cast<long long>(d));
  }
  return v.dump();
}

std::string task_series(const char* field, const std::string& task) { return std::string(field) + "/" + task; }

const Point* last_point(const Run& r, const char* key) {
  auto it = r.series.find(key);
  return it == r.series.end() || it->second.empty() ? nullptr : &it->second.back();
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace lm::report
