// `report`: one self-contained HTML page from one or more run directories.
//
//   report RUN_DIR [RUN_DIR...] [-o report.html] [--title TEXT] [--max-points N] [--smooth A]
//
// Reads each RUN_DIR's metrics.jsonl (required), config.yaml and meta.json (optional; the run
// directory as the trainer writes it, see README "The run directory") and writes ONE HTML file with
// inline CSS and inline SVG: no scripts, fonts, images or links, so it opens offline and can be
// mailed around.
// Sections: a runs table, charts (loss: train and validation on a log axis; learning rate;
// throughput; MFU; data wait; gradient norm; memory; padding), events (resumes, anomalies), the
// config and the meta tables. A chart with no data in any run becomes a one-line note. Several runs
// overlay in one colour each; their config and meta show side by side, differing rows highlighted.
//
// Reading metrics.jsonl: lines that are not JSON objects (a crash can cut the last one) are skipped
// and counted on the page; unknown kinds and missing or null fields are skipped. Each series keeps
// the latest timeline: a "resume" record at step S drops the points after S (the resumed run logs
// them again), and a point at a step <= the previous point's replaces the points from that step on.
//
// Charts are SVG built here: nice 1-2-5 ticks, log axes where values span decades, lines
// downsampled with largest-triangle-three-buckets (shape and spikes kept) to --max-points, and
// hover bands whose <title> gives every run's exact value near that step.
//
// Exit codes: 0 written; 2 with one line for bad input (no RUN_DIR, not a directory, no
// metrics.jsonl, output not writable). The page is written atomically (temp file, fsync, rename).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"

namespace lm {
namespace {

using json = nlohmann::ordered_json;

// ---- one run's data -------------------------------------------------------------------------

struct Point {
  double step, value;
};
using Series = std::vector<Point>;  // increasing step

// Flattened "section.key" -> value text, in file order.
using KV = std::vector<std::pair<std::string, std::string>>;

struct Event {
  double step;
  std::string kind, text;
};

struct Run {
  std::string dir, name;
  std::map<std::string, Series> series;  // metric name ("loss", "val_loss", "lr", ...) -> points
  std::vector<Event> events;             // resumes and anomalies, in file order
  std::vector<double> ckpt_block_ms, ckpt_mb_per_s;
  double ckpt_mb = 0;
  KV config, meta;
  bool has_config = false, has_meta = false;
  json meta_json, summary_json;  // null when absent
  int64_t bad_lines = 0;
  std::vector<int64_t> bad_line_numbers;  // the first few
  std::map<std::string, int64_t> ignored;  // records of unknown kinds (or without a step), by kind
  std::vector<std::string> notes;          // shown on the page under the runs table
};

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

// A JSON value as table text: strings bare, integral floats without ".0", the rest as JSON.
std::string compact(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 1e15) return std::to_string(static_cast<long long>(d));
  }
  return v.dump();
}

void load_metrics(Run& r, const std::string& path) {
  std::ifstream in(path);
  if (!in) throw DataError(path + ": cannot open for reading");
  static const char* kTrain[] = {"loss",          "lr",      "grad_norm", "tokens_per_s", "tokens_per_s_rank",
                                 "data_wait_pct", "mfu_pct", "mem_mb",    "padding_pct",  "step_ms",
                                 "tokens",        "epoch"};
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
    auto k = j.find("kind");
    const std::string kind = k != j.end() && k->is_string() ? k->get<std::string>() : "";
    double step = 0, v = 0;
    if (!number(j, "step", &step)) {
      ++r.ignored[(kind.empty() ? "(no kind)" : kind) + " without step"];
      continue;
    }
    if (kind == "train") {
      for (const char* f : kTrain)
        if (number(j, f, &v)) add_point(r.series[f], step, v);
    } else if (kind == "val") {
      for (const char* f : {"val_loss", "val_loss_ema"})
        if (number(j, f, &v)) add_point(r.series[f], step, v);
    } else if (kind == "checkpoint") {
      if (number(j, "ckpt_block_ms", &v)) r.ckpt_block_ms.push_back(v);
      if (number(j, "ckpt_mb_per_s", &v) && v > 0) r.ckpt_mb_per_s.push_back(v);
      if (number(j, "ckpt_mb", &v)) r.ckpt_mb = v;
    } else if (kind == "resume") {
      for (auto& [name, s] : r.series)
        while (!s.empty() && s.back().step > step) s.pop_back();
      std::string text = "resumed";
      if (auto c = j.find("checkpoint"); c != j.end() && c->is_string()) text += " from " + c->get<std::string>();
      std::string times;
      if (number(j, "recovery_ms", &v)) times += strf("recovery %.0f ms", v);
      if (number(j, "load_ms", &v)) times += strf("%sload %.0f ms", times.empty() ? "" : ", ", v);
      if (!times.empty()) text += " (" + times + ")";
      r.events.push_back({step, "resume", text});
    } else if (kind == "anomaly") {
      std::string text;
      if (auto c = j.find("reason"); c != j.end()) text = compact(*c);
      std::string rest;
      for (auto& [key, val] : j.items())
        if (key != "kind" && key != "step" && key != "reason" && key != "time") rest += (rest.empty() ? "" : ", ") + key + "=" + compact(val);
      if (!rest.empty()) text += (text.empty() ? "" : " (") + rest + (text.empty() ? "" : ")");
      r.events.push_back({step, "anomaly", text});
    } else {
      ++r.ignored[kind.empty() ? "(no kind)" : kind];
    }
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
// other arrays stay one JSON value.
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

bool is_dir(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string trim_slashes(std::string p) {
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  return p;
}

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

Run load_run(const std::string& dir) {
  Run r;
  r.dir = trim_slashes(dir);
  r.name = base_name(dir);
  if (!is_dir(r.dir)) throw DataError(dir + ": no such run directory");
  const std::string metrics = r.dir + "/metrics.jsonl";
  if (!files::exists(metrics)) throw DataError(dir + ": no metrics.jsonl (not a run directory?)");
  load_metrics(r, metrics);

  if (files::exists(r.dir + "/meta.json")) {
    try {
      r.meta_json = json::parse(files::read_file(r.dir + "/meta.json"));
      if (!r.meta_json.is_object()) throw std::runtime_error("not a JSON object");
      r.has_meta = true;
      flatten_json(r.meta_json, "", r.meta, "config");
    } catch (const std::exception& e) {
      r.meta_json = nullptr;
      r.notes.push_back("meta.json unreadable: " + std::string(e.what()));
    }
  }
  if (files::exists(r.dir + "/config.yaml")) {
    try {
      flatten_yaml(YAML::LoadFile(r.dir + "/config.yaml"), "", r.config);
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
  if (files::exists(r.dir + "/summary.json")) {
    try {
      r.summary_json = json::parse(files::read_file(r.dir + "/summary.json"));
    } catch (const std::exception&) {
      r.summary_json = nullptr;
    }
  }

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
  if (!r.has_config && !files::exists(r.dir + "/config.yaml")) r.notes.push_back("no config.yaml");
  auto has = [&](const char* k) { return r.series.count(k) && !r.series.at(k).empty(); };
  if (!has("loss") && !has("val_loss")) r.notes.push_back("no train or val records in metrics.jsonl");
  if (!r.has_meta && !files::exists(r.dir + "/meta.json")) r.notes.push_back("no meta.json");
  return r;
}

// Unique display names: the directory basename, or parent/basename when basenames collide.
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

// ---- text helpers ---------------------------------------------------------------------------

std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      case '\n': o += "&#10;"; break;
      default: o += c;
    }
  }
  return o;
}

// Exact-enough value for tables and hover titles.
std::string num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return strf("%.0f", v);
  return strf("%.6g", v);
}

// 1234567 -> "1.23M"; for counts like tokens.
std::string si(double v, int sig = 3) {
  const double a = std::fabs(v);
  const char* suf[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (a >= std::pow(1000.0, i + 1) && i < 5) ++i;
  return strf("%.*g%s", sig, v / std::pow(1000.0, i), suf[i]);
}

std::string duration(double s) {
  if (s < 120) return strf("%.1f s", s);
  if (s < 7200) return strf("%.1f min", s / 60);
  return strf("%.2f h", s / 3600);
}

// "2026-11-30T01:23:45Z" -> seconds since the epoch (-1 when not that form).
double iso_time(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return -1;
  std::tm tm{};
  const std::string s = it->get<std::string>();
  const char* end = ::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end) return -1;
  return static_cast<double>(::timegm(&tm));
}

// ---- axes -----------------------------------------------------------------------------------

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double step = 0;  // tick spacing in value units for linear ticks, 0 for log decade ticks
  std::vector<double> ticks;
  double frac(double v) const {  // 0 at lo, 1 at hi
    return log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
  }
  double value(double f) const {
    return log ? std::pow(10.0, std::log10(lo) + f * (std::log10(hi) - std::log10(lo))) : lo + f * (hi - lo);
  }
};

double nice_step(double raw) {
  if (!(raw > 0)) return 1;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

// Ticks at multiples of a 1-2-5 step; the axis ends on ticks.
Axis linear_axis(double lo, double hi, int target, double min_step = 0) {
  if (hi <= lo) {
    const double d = lo == 0 ? 1 : std::fabs(lo) * 0.5;
    lo -= lo == 0 ? 0 : d, hi += d;
  }
  Axis a;
  a.step = std::max(min_step, nice_step((hi - lo) / target));
  const double i0 = std::floor(lo / a.step + 1e-9), i1 = std::ceil(hi / a.step - 1e-9);
  a.lo = i0 * a.step, a.hi = std::max(i1, i0 + 1) * a.step;
  for (double i = i0; i <= std::max(i1, i0 + 1) + 1e-9; i += 1) a.ticks.push_back(i == 0 ? 0.0 : i * a.step);
  return a;
}

// Log axis over [lo, hi] (both > 0), padded a little: decade ticks over wide ranges, 1-2-5 ticks
// over one to three decades, plain 1-2-5 linear ticks inside less than a decade.
Axis log_axis(double lo, double hi) {
  Axis a;
  a.log = true;
  double l0 = std::log10(lo), l1 = std::log10(hi);
  if (l1 - l0 < 1e-6) l0 -= 0.05, l1 += 0.05;
  const double dec = l1 - l0, pad = 0.04 * dec;
  a.lo = std::pow(10.0, l0 - pad), a.hi = std::pow(10.0, l1 + pad);
  auto inside = [&](double v) { return v >= a.lo * (1 - 1e-9) && v <= a.hi * (1 + 1e-9); };
  if (dec >= 3) {
    const int every = static_cast<int>(std::ceil(dec / 6));
    for (int k = static_cast<int>(std::floor(l0 - pad)); k <= static_cast<int>(std::ceil(l1 + pad)); ++k)
      if (k % every == 0 && inside(std::pow(10.0, k))) a.ticks.push_back(std::pow(10.0, k));
  } else if (dec >= 1) {
    for (int k = static_cast<int>(std::floor(l0 - pad)); k <= static_cast<int>(std::ceil(l1 + pad)); ++k)
      for (double m : {1.0, 2.0, 5.0})
        if (inside(m * std::pow(10.0, k))) a.ticks.push_back(m * std::pow(10.0, k));
  } else {
    // Round mantissas, the roundest first (1 2 5, then 3 4 6 8, then 1.5 2.5 7 9), each kept when at
    // least a tenth of the axis from those kept: 3 4 5 6 8 10 over 2.7..11. Over a narrower
    // range, 1-2-5 multiples as on a linear axis.
    const double min_ratio = std::pow(10.0, 0.1 * (std::log10(a.hi) - std::log10(a.lo))) * (1 - 1e-9);
    const std::vector<std::vector<double>> levels = {{1, 2, 5}, {3, 4, 6, 8}, {1.5, 2.5, 7, 9}};
    for (auto& level : levels)
      for (int k = static_cast<int>(std::floor(l0 - pad)); k <= static_cast<int>(std::ceil(l1 + pad)); ++k)
        for (double m : level) {
          const double v = m * std::pow(10.0, k);
          if (!inside(v)) continue;
          bool far = true;
          for (double t : a.ticks) far &= std::max(v / t, t / v) >= min_ratio;
          if (far) a.ticks.push_back(v);
        }
    std::sort(a.ticks.begin(), a.ticks.end());
    if (a.ticks.size() < 4) {
      a.ticks.clear();
      a.step = nice_step((a.hi - a.lo) / 5);
      for (double i = std::ceil(a.lo / a.step - 1e-9); i * a.step <= a.hi * (1 + 1e-9); i += 1) a.ticks.push_back(i * a.step);
    }
  }
  return a;
}

std::string strip_zeros(std::string s) {  // "2.50" -> "2.5", "3.00" -> "3"
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string sci(double v, int digits) {  // 0.00025 -> "2.5e-4"
  const int e = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
  return strf("%.*fe%d", std::max(0, digits), v / std::pow(10.0, e), e);
}

// Tick label: decimals from the tick step; k/M/G for large values; scientific for tiny ones.
std::string tick_label(double v, const Axis& a) {
  if (v == 0) return "0";
  const double maxabs = std::max(std::fabs(a.lo), std::fabs(a.hi));
  if (a.step == 0) {  // log decade / 1-2-5 ticks
    if (std::fabs(v) >= 1e4) return strip_zeros(si(v, 3));
    if (std::fabs(v) < 1e-3) return strip_zeros(sci(v, 1));
    return strf("%g", v);
  }
  if (maxabs >= 1e4) {
    const double unit = maxabs >= 1e12 ? 1e12 : maxabs >= 1e9 ? 1e9 : maxabs >= 1e6 ? 1e6 : 1e3;
    const char* suf = unit == 1e12 ? "T" : unit == 1e9 ? "G" : unit == 1e6 ? "M" : "k";
    const int d = std::max(0, static_cast<int>(-std::floor(std::log10(a.step / unit) + 1e-9)));
    return strf("%.*f%s", d, v / unit, suf);
  }
  const int d = static_cast<int>(-std::floor(std::log10(a.step) + 1e-9));
  if (d > 4) return sci(v, static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9)) - (-d));
  return strf("%.*f", std::max(0, d), v);
}

// Largest-triangle-three-buckets: indices of at most `n` points keeping the visual shape (first and
// last point always kept). x increasing.
std::vector<size_t> lttb(const std::vector<double>& x, const std::vector<double>& y, size_t n) {
  const size_t m = x.size();
  std::vector<size_t> out;
  if (n >= m || n < 3) {
    for (size_t i = 0; i < m; ++i) out.push_back(i);
    return out;
  }
  const double every = static_cast<double>(m - 2) / static_cast<double>(n - 2);
  size_t a = 0;
  out.push_back(0);
  for (size_t b = 0; b < n - 2; ++b) {
    const size_t s = static_cast<size_t>(std::floor(b * every)) + 1;
    const size_t e = std::min(m - 1, static_cast<size_t>(std::floor((b + 1) * every)) + 1);
    // Average of the next bucket (the last point for the final bucket).
    const size_t ns = e, ne = std::min(m, static_cast<size_t>(std::floor((b + 2) * every)) + 1);
    double ax = 0, ay = 0;
    for (size_t i = ns; i < std::max(ne, ns + 1) && i < m; ++i) ax += x[i], ay += y[i];
    const double cnt = static_cast<double>(std::max<size_t>(1, std::min(m, std::max(ne, ns + 1)) - ns));
    ax /= cnt, ay /= cnt;
    double best = -1;
    size_t pick = s;
    for (size_t i = s; i < e; ++i) {
      const double area = std::fabs((x[a] - ax) * (y[i] - y[a]) - (x[a] - x[i]) * (ay - y[a]));
      if (area > best) best = area, pick = i;
    }
    out.push_back(pick);
    a = pick;
  }
  out.push_back(m - 1);
  return out;
}

// Debiased exponential moving average (as TensorBoard's smoothing slider).
Series smooth(const Series& s, double alpha) {
  Series o;
  double acc = 0, w = 0;
  for (auto& p : s) {
    acc = alpha * acc + (1 - alpha) * p.value;
    w = alpha * w + (1 - alpha);
    o.push_back({p.step, acc / w});
  }
  return o;
}

// ---- charts ---------------------------------------------------------------------------------

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                          "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939"};
constexpr int kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);
const char* kDash[] = {"", "7 4", "2 3"};  // per series style: solid, dashed, dotted

struct SeriesSpec {
  const char* key;    // metric name in Run::series
  const char* label;  // legend text
  int style;          // 0 solid line; 1 dashed + markers; 2 dotted + markers
};
struct ChartSpec {
  const char* id;
  const char* title;
  const char* y_title;
  bool log_y;  // log axis when all values > 0
  bool zero;   // the y axis includes 0 (linear only)
  std::vector<SeriesSpec> series;
  const char* empty_note;
};

const std::vector<ChartSpec>& chart_specs() {
  static const std::vector<ChartSpec> specs = {
      {"loss", "Loss", "loss (log scale)", true, false,
       {{"loss", "train", 0}, {"val_loss", "validation", 1}, {"val_loss_ema", "validation, EMA weights", 2}},
       "no train or validation loss values"},
      {"lr", "Learning rate", "learning rate", false, true, {{"lr", "learning rate", 0}}, "no learning-rate values"},
      {"throughput", "Throughput", "tokens / s (all ranks)", false, true, {{"tokens_per_s", "tokens / s", 0}},
       "no throughput values"},
      {"mfu", "MFU", "model FLOPs utilization (%)", false, true, {{"mfu_pct", "MFU", 0}},
       "no MFU values (mfu_pct unknown, e.g. on CPU)"},
      {"data_wait", "Data wait", "data wait (% of step time)", false, true, {{"data_wait_pct", "data wait", 0}},
       "no data-wait values"},
      {"grad_norm", "Gradient norm", "gradient norm (log scale)", true, false, {{"grad_norm", "gradient norm", 0}},
       "no gradient-norm values"},
      {"memory", "Memory", "memory (MB)", false, true, {{"mem_mb", "memory", 0}}, "no memory values (mem_mb)"},
      {"padding", "Padding", "padding (% of tokens)", false, true, {{"padding_pct", "padding", 0}},
       "no padding values (only bucketed data has padding)"},
  };
  return specs;
}

struct Options {
  std::vector<std::string> dirs;
  std::string out = "report.html";
  std::string title;
  int max_points = 800;
  double smooth = 0;
};

struct Line {
  int run;
  int spec;  // index into ChartSpec::series
  const Series* s;
};

// Geometry of every chart (viewBox units; the SVG scales to its column).
constexpr double kW = 660, kH = 330, kML = 72, kMR = 18, kMT = 14, kMB = 50;
constexpr double kPW = kW - kML - kMR, kPH = kH - kMT - kMB;

std::string colour(const std::vector<Run>& runs, int run, int spec) {
  return kPalette[(runs.size() == 1 ? spec : run) % kPaletteSize];
}

std::string swatch(const std::string& colour, int style) {
  const char* border = style == 1 ? "dashed" : style == 2 ? "dotted" : "solid";
  return "<span class=\"sw\" style=\"border-top:2px " + std::string(border) + " " + colour + "\"></span>";
}

// One chart as <figure> with an inline <svg data-chart=ID>, or "" with *note set when no run has
// data for it. `x_axis`: the steps, shared by all charts so that they line up.
std::string render_chart(const ChartSpec& c, const std::vector<Run>& runs, const Axis& x_axis, const Options& o,
                         std::string* note) {
  std::vector<Line> lines;
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t k = 0; k < c.series.size(); ++k) {
      auto it = runs[r].series.find(c.series[k].key);
      if (it != runs[r].series.end() && !it->second.empty()) lines.push_back({(int)r, (int)k, &it->second});
    }
  if (lines.empty()) {
    *note = c.empty_note;
    return "";
  }
  double ymin = INFINITY, ymax = -INFINITY;
  for (auto& l : lines)
    for (auto& p : *l.s) ymin = std::min(ymin, p.value), ymax = std::max(ymax, p.value);
  const bool log_y = c.log_y && ymin > 0;
  const Axis& xa = x_axis;
  Axis ya = log_y ? log_axis(ymin, ymax) : linear_axis(c.zero ? std::min(0.0, ymin) : ymin, c.zero ? std::max(0.0, ymax) : ymax, 5);
  auto X = [&](double v) { return kML + xa.frac(v) * kPW; };
  auto Y = [&](double v) { return kMT + (1 - ya.frac(v)) * kPH; };

  std::string s;
  s.reserve(64 * 1024);
  s += "<figure class=\"chart\" id=\"chart-" + std::string(c.id) + "\"><figcaption>" + esc(c.title) + "</figcaption>\n";
  s += strf("<svg class=\"chart\" data-chart=\"%s\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"%s\">\n", c.id, kW,
            kH, esc(c.title).c_str());
  s += strf("<rect class=\"plot\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", kML, kMT, kPW, kPH);
  // Grid and tick labels.
  s += "<g class=\"grid\">";
  for (double t : ya.ticks) s += strf("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", kML, kML + kPW, Y(t), Y(t));
  for (double t : xa.ticks) s += strf("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", X(t), X(t), kMT, kMT + kPH);
  s += "</g>\n<g class=\"ticks\">";
  for (double t : ya.ticks)
    s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", kML - 7, Y(t) + 4, esc(tick_label(t, ya)).c_str());
  for (double t : xa.ticks)
    s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", X(t), kMT + kPH + 17,
              esc(tick_label(t, xa)).c_str());
  s += "</g>\n";
  s += strf("<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", kML, kMT, kPW, kPH);
  s += strf("<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", kML + kPW / 2, kH - 10);
  s += strf("<text class=\"axis-title\" transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            kMT + kPH / 2, esc(c.y_title).c_str());

  // Resume lines and anomaly marks of the runs drawn here.
  std::set<int> drawn_runs;
  for (auto& l : lines) drawn_runs.insert(l.run);
  std::string ev;
  for (int r : drawn_runs)
    for (auto& e : runs[r].events) {
      if (e.step < xa.lo || e.step > xa.hi) continue;
      const std::string title = "<title>" + esc(runs[r].name + ": " + e.kind + " at step " + num(e.step) + ": " + e.text) + "</title>";
      if (e.kind == "resume")
        ev += strf("<line class=\"ev-resume\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\">", X(e.step),
                   X(e.step), kMT, kMT + kPH, colour(runs, r, 0).c_str()) + title + "</line>";
      else
        ev += strf("<path class=\"ev-anomaly\" d=\"M%.1f %.1fl-5 -8h10z\">", X(e.step), kMT + kPH) + title + "</path>";
    }
  if (!ev.empty()) s += "<g class=\"events\">" + ev + "</g>\n";

  // The lines: one <polyline class="series"> per (run, series); optionally a faint raw line under
  // a smoothed one.
  std::string markers;
  s += "<g class=\"lines\">\n";
  for (auto& l : lines) {
    const SeriesSpec& sp = c.series[l.spec];
    const std::string col = colour(runs, l.run, l.spec);
    // Smoothing is for the noisy measurements, not for the schedule or memory.
    const bool smoothed = o.smooth > 0 && sp.style == 0 && l.s->size() > 2 && std::string(sp.key) != "lr" &&
                          std::string(sp.key) != "mem_mb";
    auto polyline = [&](const Series& pts, const std::string& cls) {
      std::vector<double> px, py;
      px.reserve(pts.size()), py.reserve(pts.size());
      for (auto& p : pts) px.push_back(X(p.step)), py.push_back(Y(p.value));
      std::string p = strf("<polyline class=\"%s\" data-run=\"%d\" data-series=\"%s\" data-n=\"%zu\" stroke=\"%s\"",
                           cls.c_str(), l.run, sp.key, pts.size(), col.c_str());
      if (*kDash[sp.style]) p += strf(" stroke-dasharray=\"%s\"", kDash[sp.style]);
      p += " points=\"";
      for (size_t i : lttb(px, py, static_cast<size_t>(o.max_points))) p += strf("%.1f,%.1f ", px[i], py[i]);
      if (p.back() == ' ') p.pop_back();
      const Series& raw = *l.s;
      auto mn = std::min_element(raw.begin(), raw.end(), [](auto& a, auto& b) { return a.value < b.value; });
      p += "\"><title>" +
           esc(runs[l.run].name + " \xC2\xB7 " + sp.label + ": " + std::to_string(raw.size()) + " points; last " +
               num(raw.back().value) + " @ step " + num(raw.back().step) + "; min " + num(mn->value) + " @ step " +
               num(mn->step)) +
           "</title></polyline>\n";
      return p;
    };
    if (smoothed) {
      s += polyline(*l.s, "raw");
      s += polyline(smooth(*l.s, o.smooth), "series");
    } else {
      s += polyline(*l.s, "series");
    }
    if (sp.style != 0 || l.s->size() == 1) {  // markers on sparse series (validation), thinned to 150
      std::vector<double> px, py;
      for (auto& p : *l.s) px.push_back(X(p.step)), py.push_back(Y(p.value));
      for (size_t i : lttb(px, py, 150))
        markers += strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>", px[i], py[i], col.c_str()) +
                   esc(runs[l.run].name + " \xC2\xB7 " + sp.label + " = " + num((*l.s)[i].value) + " @ step " +
                       num((*l.s)[i].step)) +
                   "</title></circle>";
    }
  }
  s += "</g>\n";

  // Hover bands: every run's exact values nearest the band's step. Up to 120 distinct steps, one
  // band per step (from halfway to the previous step to halfway to the next); beyond, 120 equal
  // bands, each showing the points nearest its middle (the last band: its last points).
  struct Band {
    double s0, s1, at;  // step range [s0, s1) (the last band includes s1), preferred step
  };
  std::vector<Band> bands;
  {
    std::set<double> steps;
    for (auto& l : lines) {
      for (auto& p : *l.s) steps.insert(p.step);
      if (steps.size() > 120) break;
    }
    if (steps.size() <= 120) {
      std::vector<double> u(steps.begin(), steps.end());
      for (size_t i = 0; i < u.size(); ++i)
        bands.push_back({i == 0 ? xa.lo : (u[i - 1] + u[i]) / 2, i + 1 == u.size() ? xa.hi : (u[i] + u[i + 1]) / 2, u[i]});
    } else {
      for (int b = 0; b < 120; ++b) {
        const double s0 = xa.value(b / 120.0), s1 = xa.value((b + 1) / 120.0);
        bands.push_back({s0, s1, b == 119 ? s1 : (s0 + s1) / 2});
      }
    }
  }
  s += "<g class=\"hover\">";
  for (size_t b = 0; b < bands.size(); ++b) {
    const Band& band = bands[b];
    const bool last_band = b + 1 == bands.size();
    std::string text;
    double lo_step = INFINITY, hi_step = -INFINITY;
    for (auto& l : lines) {
      const Series& ser = *l.s;
      auto it = std::lower_bound(ser.begin(), ser.end(), band.s0, [](const Point& p, double v) { return p.step < v; });
      const Point* best = nullptr;
      for (; it != ser.end() && (it->step < band.s1 || (last_band && it->step <= band.s1)); ++it)
        if (!best || std::fabs(it->step - band.at) < std::fabs(best->step - band.at)) best = &*it;
      if (!best) continue;
      lo_step = std::min(lo_step, best->step), hi_step = std::max(hi_step, best->step);
      std::string who = runs.size() > 1 ? runs[l.run].name : "";
      if (c.series.size() > 1) who += (who.empty() ? "" : " \xC2\xB7 ") + std::string(c.series[l.spec].label);
      if (who.empty()) who = c.series[l.spec].label;
      text += "\n" + who + " = " + num(best->value) + (runs.size() > 1 || c.series.size() > 1 ? " @ " + num(best->step) : "");
    }
    if (text.empty()) continue;
    const std::string head = lo_step == hi_step ? "step " + num(lo_step) : "steps " + num(lo_step) + "\xE2\x80\x93" + num(hi_step);
    const double x0 = X(band.s0), x1 = X(band.s1);
    s += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\"><title>", x0, kMT, std::max(0.5, x1 - x0), kPH) +
         esc(head + text) + "</title></rect>";
  }
  s += "</g>\n";
  if (!markers.empty()) s += "<g class=\"markers\">" + markers + "</g>\n";
  s += "</svg>\n";

  // Legend (HTML, wraps): runs by colour when overlaid, series by style.
  s += "<div class=\"legend\">";
  std::set<int> specs_drawn;
  for (auto& l : lines) specs_drawn.insert(l.spec);
  if (runs.size() == 1) {
    for (int k : specs_drawn) s += "<span>" + swatch(colour(runs, 0, k), c.series[k].style) + esc(c.series[k].label) + "</span>";
  } else {
    for (int r : drawn_runs) s += "<span>" + swatch(colour(runs, r, 0), 0) + esc(runs[r].name) + "</span>";
    if (specs_drawn.size() > 1)
      for (int k : specs_drawn) s += "<span class=\"style\">" + swatch("#667085", c.series[k].style) + esc(c.series[k].label) + "</span>";
  }
  std::string missing;
  for (size_t r = 0; r < runs.size(); ++r)
    if (!drawn_runs.count((int)r)) missing += (missing.empty() ? "" : ", ") + runs[r].name;
  if (!missing.empty()) s += "<span class=\"nodata\">no data: " + esc(missing) + "</span>";
  s += "</div></figure>\n";
  return s;
}

// ---- tables ---------------------------------------------------------------------------------

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::vector<double> values(const Run& r, const char* key) {
  std::vector<double> v;
  if (auto it = r.series.find(key); it != r.series.end())
    for (auto& p : it->second) v.push_back(p.value);
  return v;
}

const std::string* kv_find(const KV& kv, const std::string& key) {
  for (auto& [k, v] : kv)
    if (k == key) return &v;
  return nullptr;
}

// Keys (in first-seen order) whose values differ between the runs that have the file (a run
// without config.yaml or meta.json differs in nothing), or are missing in some of them.
std::vector<std::string> differing_keys(const std::vector<Run>& runs, KV Run::*field) {
  std::vector<std::string> keys, out;
  std::set<std::string> seen;
  for (auto& r : runs)
    for (auto& [k, v] : r.*field)
      if (seen.insert(k).second) keys.push_back(k);
  for (auto& k : keys) {
    std::set<std::string> vals;
    bool missing = false;
    for (auto& r : runs) {
      if ((r.*field).empty()) continue;
      auto* v = kv_find(r.*field, k);
      if (v) vals.insert(*v);
      else missing = true;
    }
    if (vals.size() > 1 || missing) out.push_back(k);
  }
  return out;
}

std::string cell_value(const std::string& v) {
  return v.empty() ? "<span class=\"dim\">&quot;&quot;</span>" : esc(v);
}

std::string runs_table(const std::vector<Run>& runs) {
  std::vector<std::string> diff_cols;
  if (runs.size() > 1)
    for (auto& k : differing_keys(runs, &Run::config))
      if (k != "run.dir" && diff_cols.size() < 8 &&
          std::all_of(runs.begin(), runs.end(), [&](const Run& r) { return r.config.empty() || kv_find(r.config, k); }))
        diff_cols.push_back(k);  // keys that only some configs have (older trainers) stay in the config table
  std::string s = "<div class=\"scroll\"><table class=\"runs\"><thead><tr><th>run</th><th>status</th><th>steps</th><th>tokens</th>"
                  "<th>train loss<br><span class=\"dim\">last</span></th><th>val loss<br><span class=\"dim\">last</span></th>"
                  "<th>val loss<br><span class=\"dim\">best @ step</span></th>"
                  "<th>tokens/s<br><span class=\"dim\">median</span></th><th>MFU %<br><span class=\"dim\">median</span></th>"
                  "<th>data wait<br><span class=\"dim\">mean %</span></th><th>wall<br><span class=\"dim\">time</span></th>"
                  "<th>checkpoints<br><span class=\"dim\">blocked ms</span></th><th>resumes<br><span class=\"dim\">anomalies</span></th>";
  for (auto& k : diff_cols) {
    std::string wrapped = esc(k);
    for (size_t p = wrapped.find('.'); p != std::string::npos; p = wrapped.find('.', p + 6)) wrapped.insert(p + 1, "<wbr>");
    s += "<th class=\"cfg\">" + wrapped + "</th>";
  }
  s += "</tr></thead><tbody>\n";
  const char* dash = "<span class=\"dim\">\xE2\x80\x94</span>";
  for (size_t i = 0; i < runs.size(); ++i) {
    const Run& r = runs[i];
    auto last = [&](const char* key) -> const Point* {
      auto it = r.series.find(key);
      return it == r.series.end() || it->second.empty() ? nullptr : &it->second.back();
    };
    const Point* lastp = last("loss") ? last("loss") : last("lr");
    const std::string* max_steps = kv_find(r.config, "train.max_steps");
    // meta.json's status; else summary.json (written at the end and on a stop signal) and the step.
    std::string status;
    if (r.has_meta && r.meta_json.contains("status")) status = compact(r.meta_json["status"]);
    else if (!r.summary_json.is_object()) status = "incomplete";
    else status = lastp && max_steps && num(lastp->step) != *max_steps ? "stopped" : "completed";
    std::string steps = dash;
    if (lastp) steps = num(lastp->step);
    if (max_steps && lastp) steps += " / " + esc(*max_steps);
    std::string tokens = dash;
    if (auto* p = last("tokens")) tokens = si(p->value);
    std::string loss = dash;
    if (auto* p = last("loss")) loss = strf("%.4f", p->value);
    std::string val = dash, best = dash;
    if (auto* p = last("val_loss")) {
      const Series& vs = r.series.at("val_loss");
      auto mn = std::min_element(vs.begin(), vs.end(), [](auto& a, auto& b) { return a.value < b.value; });
      val = strf("%.4f", p->value);
      best = strf("%.4f <span class=\"dim\">@ %s</span>", mn->value, num(mn->step).c_str());
    }
    const double tps = median(values(r, "tokens_per_s"));
    const double mfu = median(values(r, "mfu_pct"));
    auto w = values(r, "data_wait_pct");
    double wait = NAN;
    if (!w.empty()) {
      wait = 0;
      for (double x : w) wait += x;
      wait /= w.size();
    }
    double wall = -1;
    if (r.summary_json.is_object() && r.summary_json.contains("wall_s") && r.summary_json["wall_s"].is_number())
      wall = r.summary_json["wall_s"].get<double>();
    else if (r.has_meta && iso_time(r.meta_json, "start_time") >= 0 && iso_time(r.meta_json, "end_time") >= 0)
      wall = iso_time(r.meta_json, "end_time") - iso_time(r.meta_json, "start_time");
    std::string ck = "<td class=\"n\">" + std::to_string(r.ckpt_block_ms.size());
    if (!r.ckpt_block_ms.empty())
      ck = strf("<td class=\"n\" title=\"%.1f MB each; median: blocked %.1f ms%s\">%zu <span class=\"dim\">\xC2\xB7 %.0f</span>",
                r.ckpt_mb, median(r.ckpt_block_ms),
                r.ckpt_mb_per_s.empty() ? "" : strf(", written at %.0f MB/s", median(r.ckpt_mb_per_s)).c_str(),
                r.ckpt_block_ms.size(), median(r.ckpt_block_ms));
    ck += "</td>";
    int resumes = 0, anomalies = 0;
    for (auto& e : r.events) (e.kind == "resume" ? resumes : anomalies)++;
    s += "<tr><td class=\"name\" title=\"" + esc(r.dir) + "\">" + swatch(kPalette[i % kPaletteSize], 0) + esc(r.name) + "</td>";
    s += "<td>" + esc(status) + "</td><td class=\"n\">" + steps + "</td><td class=\"n\">" + tokens + "</td><td class=\"n\">" +
         loss + "</td><td class=\"n\">" + val + "</td><td class=\"n\">" + best + "</td>";
    s += "<td class=\"n\">" + (std::isnan(tps) ? std::string(dash) : si(tps)) + "</td>";
    s += "<td class=\"n\">" + (std::isnan(mfu) ? std::string(dash) : strf("%.1f", mfu)) + "</td>";
    s += "<td class=\"n\">" + (std::isnan(wait) ? std::string(dash) : strf("%.2f", wait)) + "</td>";
    s += "<td class=\"n\">" + (wall < 0 ? std::string(dash) : duration(wall)) + "</td>";
    s += ck + "<td class=\"n\">" + std::to_string(resumes) + " <span class=\"dim\">/</span> " +
         (anomalies ? "<span class=\"warn\">" + std::to_string(anomalies) + "</span>" : std::string("0")) + "</td>";
    for (auto& k : diff_cols) {
      auto* v = kv_find(r.config, k);
      s += "<td class=\"cfg\">" + (v ? cell_value(*v) : std::string(dash)) + "</td>";
    }
    s += "</tr>\n";
  }
  s += "</tbody></table></div>\n";
  std::string notes;
  for (auto& r : runs)
    for (auto& n : r.notes) notes += "<li>" + (runs.size() > 1 ? "<b>" + esc(r.name) + "</b>: " : std::string()) + esc(n) + "</li>";
  if (!notes.empty()) s += "<ul class=\"notes\">" + notes + "</ul>\n";
  return s;
}

std::string events_section(const std::vector<Run>& runs) {
  std::string rows;
  constexpr size_t kMaxRows = 200;
  for (auto& r : runs) {
    size_t n = 0;
    for (auto& e : r.events) {
      if (++n > kMaxRows) continue;
      rows += "<tr class=\"" + e.kind + "\"><td>" + esc(r.name) + "</td><td class=\"n\">" + num(e.step) + "</td><td>" +
              esc(e.kind) + "</td><td class=\"wrap\">" + esc(e.text) + "</td></tr>\n";
    }
    if (n > kMaxRows)
      rows += "<tr><td>" + esc(r.name) + "</td><td></td><td></td><td class=\"dim\">" + std::to_string(n - kMaxRows) +
              " more not shown</td></tr>\n";
  }
  if (rows.empty()) return "<p class=\"dim\">No resumes or anomalies.</p>\n";
  return "<table class=\"events\"><thead><tr><th>run</th><th>step</th><th>kind</th><th>details</th></tr></thead><tbody>\n" +
         rows + "</tbody></table>\n";
}

// Config or meta as one table per top-level section, runs side by side; rows whose values differ
// between runs have class "diff" (highlighted), the others "same"; cells that differ from the first
// run's value have class "chg". With several runs a CSS-only checkbox hides the "same" rows.
std::string kv_section(const std::vector<Run>& runs, KV Run::*field, const std::string& id, const std::string& what) {
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (auto& r : runs)
    for (auto& [k, v] : r.*field)
      if (seen.insert(k).second) keys.push_back(k);
  if (keys.empty()) return "<p class=\"dim\">No " + esc(what) + " in " + (runs.size() > 1 ? "any run" : "this run") + ".</p>\n";
  std::vector<std::string> diff = differing_keys(runs, field);
  std::set<std::string> diffs(diff.begin(), diff.end());

  // Sections in first-seen order; keys without a dot form "general".
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> sections;
  for (auto& k : keys) {
    const auto dot = k.find('.');
    const std::string sec = dot == std::string::npos ? "general" : k.substr(0, dot);
    if (!sections.count(sec)) order.push_back(sec);
    sections[sec].push_back(k);
  }
  const bool multi = runs.size() > 1;
  std::string s;
  if (multi)
    s += "<input type=\"checkbox\" class=\"only-diff\" id=\"" + id + "-only\"><label for=\"" + id + "-only\">show only differing keys (" +
         std::to_string(diff.size()) + " of " + std::to_string(keys.size()) + ")</label>\n";
  const int minw = multi ? std::min(1200, 200 + 170 * static_cast<int>(runs.size())) : 340;
  s += strf("<div class=\"kvgrid\" style=\"grid-template-columns:repeat(auto-fill,minmax(%dpx,1fr))\">\n", minw);
  for (auto& sec : order) {
    bool any_diff = false;
    for (auto& k : sections[sec]) any_diff |= diffs.count(k) > 0;
    s += "<table class=\"kv" + std::string(multi ? " multi" : "") + (any_diff ? " has-diff" : " all-same") + "\" data-section=\"" + esc(sec) +
         "\"><thead><tr><th>" + esc(sec) + "</th>";
    if (multi)
      for (size_t i = 0; i < runs.size(); ++i)
        s += "<th>" + swatch(kPalette[i % kPaletteSize], 0) + esc(runs[i].name) +
             ((runs[i].*field).empty() ? " <span class=\"dim\">(no " + esc(what) + ")</span>" : "") + "</th>";
    else
      s += "<th></th>";
    s += "</tr></thead><tbody>\n";
    for (auto& k : sections[sec]) {
      const bool d = diffs.count(k) > 0;
      const std::string shown = sec == "general" ? k : k.substr(sec.size() + 1);
      s += "<tr class=\"" + std::string(d ? "diff" : "same") + "\" data-key=\"" + esc(k) + "\"><th>" + esc(shown) + "</th>";
      // Changed cells: those differing from the first run that has the file.
      const Run* ref = nullptr;
      for (auto& r : runs)
        if (!ref && !(r.*field).empty()) ref = &r;
      const std::string* first = kv_find(ref->*field, k);
      for (auto& r : runs) {
        const std::string* v = kv_find(r.*field, k);
        const bool chg = d && !(r.*field).empty() && (!v || !first || *v != *first);
        s += std::string("<td") + (chg ? " class=\"chg\"" : "") + ">" +
             (v ? cell_value(*v) : "<span class=\"dim\">\xE2\x80\x94</span>") + "</td>";
      }
      s += "</tr>\n";
    }
    s += "</tbody></table>\n";
  }
  s += "</div>\n";
  return s;
}

const char* kCss = R"CSS(
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--bg:#f4f5f7;--card:#fff;--hl:#fff4c2;--hl2:#ffd666}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:18px 28px 6px}
h1{font-size:22px;margin:0 0 2px}
.sub{color:var(--muted);margin:0}
nav{padding:4px 28px 0;font-size:13px}
nav a{color:#175cd3;text-decoration:none;margin-right:14px}
.runbar{position:sticky;top:0;z-index:2;background:rgba(244,245,247,.95);padding:6px 28px;border-bottom:1px solid var(--line);display:flex;flex-wrap:wrap;gap:4px 16px;font-size:13px}
section{margin:14px 28px;background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 18px}
h2{font-size:16px;margin:0 0 10px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:22px 26px}
figure.chart{margin:0;min-width:0}
figcaption{font-weight:600;margin:0 0 2px 4px}
svg.chart{width:100%;height:auto;display:block}
svg.chart text{font-size:11px;fill:#475467}
svg.chart .axis-title{font-size:12px;fill:#344054}
svg.chart .plot{fill:#fcfcfd}
svg.chart .frame{fill:none;stroke:#c4c9d2}
svg.chart .grid line{stroke:#eaecf0}
svg.chart polyline{fill:none;stroke-linejoin:round;stroke-linecap:round}
svg.chart .series{stroke-width:1.7}
svg.chart .raw{stroke-width:1;opacity:.28}
svg.chart .hover rect{fill:transparent}
svg.chart .hover rect:hover{fill:rgba(16,24,40,.07)}
svg.chart .ev-resume{stroke-dasharray:4 3;stroke-width:1.3;opacity:.85}
svg.chart .ev-anomaly{fill:#d92d20}
.legend{display:flex;flex-wrap:wrap;gap:2px 14px;font-size:12px;color:#344054;margin:2px 0 0 72px}
.legend .style{color:var(--muted)}
.legend .nodata{color:var(--muted);font-style:italic}
.sw{display:inline-block;width:22px;height:0;vertical-align:middle;margin-right:5px}
.skipped{color:var(--muted);margin:14px 0 0;padding-left:18px}
table{border-collapse:collapse;font-size:13px}
th,td{padding:3px 9px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
thead th{background:#f9fafb;font-weight:600;border-bottom:1px solid #d0d5dd}
table.runs{font-size:12.5px}
table.runs th,table.runs td{padding:3px 7px}
table.runs thead th{white-space:nowrap}
table.runs thead th.cfg{white-space:normal;min-width:70px}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.warn{color:#b42318;font-weight:600}
td.name{white-space:nowrap;font-weight:600}
th.cfg,td.cfg{background:#f5f8ff}
.dim{color:var(--muted);font-weight:400}
.scroll{overflow-x:auto}
.notes{margin:10px 0 0;padding-left:18px;color:#93370d}
.wrap{overflow-wrap:anywhere}
.kvgrid{display:grid;gap:14px 18px;align-items:start}
table.kv{width:100%;table-layout:fixed}
table.kv th:first-child{width:38%}
table.kv.multi th:first-child{width:210px}
table.kv td,table.kv tbody th{overflow-wrap:anywhere;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
table.kv tbody th{font-weight:400;color:#344054}
table.kv thead th:first-child{text-transform:uppercase;letter-spacing:.04em;font-size:12px;color:#475467}
tr.diff td,tr.diff th{background:var(--hl)}
tr.diff td.chg{background:var(--hl2);font-weight:600}
.only-diff:checked~.kvgrid tr.same,.only-diff:checked~.kvgrid table.all-same{display:none}
label{font-size:13px;color:#344054;margin-left:4px}
.only-diff{margin:0 0 10px}
footer{color:var(--muted);font-size:12px;padding:4px 28px 24px}
)CSS";

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

std::string render_page(const std::vector<Run>& runs, const Options& o, int* charts_drawn) {
  std::string title = o.title;
  if (title.empty()) {
    title = "Run report: ";
    for (size_t i = 0; i < runs.size() && i < 4; ++i) title += (i ? ", " : "") + runs[i].name;
    if (runs.size() > 4) title += strf(" + %zu more", runs.size() - 4);
  }
  std::string h;
  h.reserve(1 << 20);
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
       "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
       esc(title) + "</title>\n<style>" + kCss + "</style></head>\n<body>\n";
  h += "<header><h1>" + esc(title) + "</h1><p class=\"sub\">" + std::to_string(runs.size()) +
       (runs.size() == 1 ? " run (" + esc(runs[0].dir) + ")" : " runs") + " \xC2\xB7 generated " + now_utc() +
       " by build/bin/report</p></header>\n";
  h += "<nav><a href=\"#runs\">Runs</a><a href=\"#charts\">Charts</a><a href=\"#events\">Events</a>"
       "<a href=\"#config\">Config</a><a href=\"#meta\">Meta</a></nav>\n";
  if (runs.size() > 1) {
    h += "<div class=\"runbar\">";
    for (size_t i = 0; i < runs.size(); ++i) h += "<span>" + swatch(kPalette[i % kPaletteSize], 0) + esc(runs[i].name) + "</span>";
    h += "</div>\n";
  }
  h += "<section id=\"runs\"><h2>Runs</h2>\n" + runs_table(runs) + "</section>\n";

  h += "<section id=\"charts\"><h2>Charts</h2>\n<div class=\"charts\">\n";
  // One step axis for every chart, over every charted series of every run.
  double xmin = INFINITY, xmax = -INFINITY;
  for (auto& c : chart_specs())
    for (auto& sp : c.series)
      for (auto& r : runs)
        if (auto it = r.series.find(sp.key); it != r.series.end() && !it->second.empty())
          xmin = std::min(xmin, it->second.front().step), xmax = std::max(xmax, it->second.back().step);
  if (!(xmin <= xmax)) xmin = xmax = 0;
  const Axis x_axis = linear_axis(xmin > 0.2 * xmax ? xmin : 0, std::max(xmax, 1.0), 6, 1);
  std::string skipped;
  *charts_drawn = 0;
  for (auto& c : chart_specs()) {
    std::string note;
    std::string fig = render_chart(c, runs, x_axis, o, &note);
    if (fig.empty()) {
      skipped += "<li data-chart=\"" + std::string(c.id) + "\"><b>" + esc(c.title) + "</b>: " + esc(note) + "</li>";
    } else {
      h += fig;
      ++*charts_drawn;
    }
  }
  h += "</div>\n";
  if (!skipped.empty()) h += "<ul class=\"skipped\">" + skipped + "</ul>\n";
  h += "</section>\n";
  h += "<section id=\"events\"><h2>Events</h2>\n" + events_section(runs) + "</section>\n";
  h += "<section id=\"config\"><h2>Config</h2>\n" + kv_section(runs, &Run::config, "config", "config.yaml") + "</section>\n";
  h += "<section id=\"meta\"><h2>Meta</h2>\n" + kv_section(runs, &Run::meta, "meta", "meta.json") + "</section>\n";
  h += "<footer>Hover a chart for exact values; dashed vertical lines mark resumes, red triangles anomalies.";
  if (o.smooth > 0) h += strf(" Train lines smoothed (EMA %.2f) over the faint raw values.", o.smooth);
  h += "</footer>\n</body></html>\n";
  return h;
}

// Refuses an output path that cannot be written (checked before the runs are read).
void check_output(const std::string& out) {
  if (is_dir(out)) throw UsageError("-o " + out + ": is a directory, expected an HTML file name");
  const auto slash = out.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : out.substr(0, slash);
  if (!is_dir(parent)) throw DataError("cannot write " + out + ": no directory " + parent);
  if (::access(parent.c_str(), W_OK) != 0) throw DataError("cannot write " + out + ": directory " + parent + " is not writable");
}

void write_output(const std::string& out, const std::string& html) {
  try {
    files::write_file_atomic(out, html);
  } catch (const Error& e) {
    throw DataError("cannot write " + out + ": " + e.what());
  }
}

int report_main(int argc, char** argv) {
  Options o;
  CLI::App app{"report: one self-contained HTML page (inline CSS + SVG charts, config and meta tables) from one or\n"
               "more run directories; several runs are overlaid and their config/meta differences highlighted."};
  app.add_option("RUN_DIR", o.dirs, "Run directories (each with metrics.jsonl; config.yaml and meta.json optional)");
  app.add_option("-o,--out", o.out, "Output HTML file, written atomically")->capture_default_str();
  app.add_option("--title", o.title, "Page title (default: the run names)");
  app.add_option("--max-points", o.max_points, "Most points drawn per line (downsampled keeping the shape)")
      ->capture_default_str();
  app.add_option("--smooth", o.smooth, "EMA smoothing in [0, 1) of the noisy train lines (loss, throughput, MFU, data wait, grad norm, padding); raw values drawn faint under them")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help
    throw UsageError(e.what());
  }
  if (o.dirs.empty()) throw UsageError("no RUN_DIR given (usage: report RUN_DIR [RUN_DIR...] -o report.html)");
  if (o.out.empty()) throw UsageError("-o: empty output path");
  if (o.max_points < 10) throw UsageError(strf("--max-points %d: must be at least 10", o.max_points));
  if (!(o.smooth >= 0 && o.smooth < 1)) throw UsageError(strf("--smooth %g: must be in [0, 1)", o.smooth));

  check_output(o.out);
  std::vector<Run> runs;
  for (auto& d : o.dirs) runs.push_back(load_run(d));
  name_runs(runs);
  int charts = 0;
  const std::string html = render_page(runs, o, &charts);
  write_output(o.out, html);
  std::printf("report: wrote %s (%zu run%s, %d charts)\n", o.out.c_str(), runs.size(), runs.size() == 1 ? "" : "s", charts);
  return kExitOk;
}

}  // namespace
}  // namespace lm

int main(int argc, char** argv) {
  return lm::run_main("report", [&] { return lm::report_main(argc, argv); });
}
