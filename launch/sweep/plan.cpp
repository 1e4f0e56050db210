// The runs of a sweep (see plan.h).
#include "launch/sweep/plan.h"

#include <nlohmann/json.hpp>

#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "run/run_dir.h"
#include "run/records.h"

namespace lm::sweep {
namespace {

namespace stdfs = std::filesystem;
using Rows = std::vector<std::vector<KV>>;  // each row: the key=value pairs one run takes

constexpr size_t kMaxName = 96;
constexpr const char* kSeedKey = "run.seed";

std::string sanitize(const std::string& s) {
  std::string o;
  for (char c : s) o += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '+' || c == '-') ? c : '-';
  return o;
}

std::string leaf_of(const std::string& key) {
  auto p = key.rfind('.');
  return p == std::string::npos ? key : key.substr(p + 1);
}

std::string hash8(const std::vector<KV>& kv) {
  std::string text;
  for (auto& [k, v] : kv) text += k + "=" + v + "\n";
  return hex64(xxh64(text.data(), text.size())).substr(0, 8);
}

// The product of the factors, outermost first: one factor per grid key, the zip rows, the seeds.
Rows combinations(const SweepSpec& s) {
  std::vector<Rows> factors;
  for (auto& a : s.grid) {
    Rows rows;
    for (auto& v : a.values) rows.push_back({{a.key, v}});
    factors.push_back(std::move(rows));
  }
  if (!s.zip.empty()) {
    Rows rows(s.zip[0].values.size());
    for (auto& a : s.zip)
      for (size_t i = 0; i < rows.size(); ++i) rows[i].emplace_back(a.key, a.values[i]);
    factors.push_back(std::move(rows));
  }
  if (!s.seeds.empty()) {
    Rows rows;
    for (auto& v : s.seeds) rows.push_back({{kSeedKey, v}});
    factors.push_back(std::move(rows));
  }
  // A bound before expanding: 12 axes of 10 values would be 10^12 runs (found by tests/fuzz).
  constexpr size_t kMaxRuns = 10000;
  size_t n = 1;
  for (auto& f : factors) {
    n = f.empty() ? 0 : (n > kMaxRuns / f.size() ? kMaxRuns + 1 : n * f.size());
    if (n > kMaxRuns) throw ConfigError(s.path + ": more than " + std::to_string(kMaxRuns) + " runs; split the sweep");
  }
  Rows combos{{}};
  for (auto& f : factors) {
    Rows next;
    for (auto& c : combos)
      for (auto& row : f) {
        next.push_back(c);
        next.back().insert(next.back().end(), row.begin(), row.end());
      }
    combos = std::move(next);
  }
  return combos;
}

// How a swept key shows in run names: its leaf, or the full key when two swept keys share a leaf.
std::map<std::string, std::string> name_labels(const SweepSpec& s) {
  std::vector<std::string> keys;
  for (auto& a : s.grid) keys.push_back(a.key);
  for (auto& a : s.zip) keys.push_back(a.key);
  if (!s.seeds.empty()) keys.push_back(kSeedKey);
  std::map<std::string, int> leaf_count;
  for (auto& k : keys) ++leaf_count[leaf_of(k)];
  std::map<std::string, std::string> labels;
  for (auto& k : keys) labels[k] = leaf_count[leaf_of(k)] > 1 ? k : leaf_of(k);
  return labels;
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

std::optional<nlohmann::json> read_json(const std::string& path) {
  if (!files::exists(path)) return std::nullopt;
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// "section.leaf" -> value of a to_yaml() text.
std::map<std::string, std::string> yaml_keys(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  std::string section;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line[0] != ' ') {
      section = line.substr(0, line.find(':'));
      continue;
    }
    auto colon = line.find(':');
    out[section + "." + line.substr(2, colon - 2)] = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
  }
  return out;
}

// Refuses a run directory made with a different config: its results would be reported (or
// continued) under this sweep's name. Operational keys may differ.
void check_existing_config(const Run& r) {
  const std::string path = run_dir::config(r.dir);
  if (!files::exists(path)) return;
  ExperimentConfig old;
  try {
    old = load_config(path, {});
  } catch (const ConfigError& e) {
    log::warn("run " + r.name + ": cannot compare with its existing config (" + e.what() + ")");
    return;
  }
  const ExperimentConfig& now = r.cfg;
  old.run.dir = now.run.dir;
  old.train.threads = now.train.threads;
  old.train.max_steps = now.train.max_steps;
  old.data.workers = now.data.workers;
  old.data.prefetch = now.data.prefetch;
  old.checkpoint = now.checkpoint;
  old.log = now.log;
  old.dist.timeout_s = now.dist.timeout_s;
  auto a = yaml_keys(to_yaml(old)), b = yaml_keys(to_yaml(now));
  std::string diff;
  int n = 0;
  for (auto& [k, v] : b)
    if (a[k] != v && n++ < 3) diff += (diff.empty() ? "" : ", ") + k + " " + a[k] + " -> " + v;
  if (n > 0)
    throw ConfigError("run " + r.name + ": " + path + " was made with a different config (" + diff +
                      (n > 3 ? ", ..." : "") + "); use another sweep dir or remove " + r.dir);
}

// The run's config from base + overrides + its axes, its trainer command and its state.
void plan_run(const SweepSpec& s, Run& r, const std::string& bin_dir) {
  std::vector<std::string> ov;
  for (auto& [k, v] : s.overrides) ov.push_back(k + "=" + v);
  for (auto& [k, v] : r.axes) ov.push_back(k + "=" + v);
  ov.push_back("run.dir=" + r.dir);
  try {
    r.cfg = load_config(s.base, ov);
  } catch (const ConfigError& e) {
    throw ConfigError("run " + r.name + ": " + e.what());
  }
  r.argv = {bin_dir + "/trainer", s.base};
  r.argv.insert(r.argv.end(), ov.begin(), ov.end());
  if (finished(r)) {
    r.state = State::kDone;
  } else if ((r.resume_step = newest_checkpoint(r.dir)) > 0) {
    r.state = State::kPartial;
  }
  check_existing_config(r);
}

// Cores split between the runs that execute together (K > 1 only: with one run at a time the
// trainer's own default threading is the measured best, see trainer/train.cpp).
void split_cores(const SweepSpec& s, std::vector<Run>& runs, int parallel) {
  int todo = 0;
  for (auto& r : runs) todo += r.state != State::kDone;
  const int together = std::min(parallel, std::max(todo, 1));
  if (together <= 1) return;
  const int threads = std::max(1, usable_cores() / (together * s.nproc));
  for (auto& r : runs) {
    r.threads = threads;
    if (r.cfg.train.threads == 0) {  // not chosen by the user
      r.argv.push_back("train.threads=" + std::to_string(threads));
      r.cfg.train.threads = threads;
    }
  }
}

std::string state_text(const Run& r) {
  switch (r.state) {
    case State::kDone: return "done";
    case State::kPartial: return "resume@" + std::to_string(r.resume_step);
    default: return files::exists(r.dir) ? "restart" : "new";
  }
}

}  // namespace

std::vector<Run> expand(const SweepSpec& s) {
  const auto labels = name_labels(s);
  std::vector<Run> runs;
  std::map<std::string, int> name_count;
  std::set<std::vector<KV>> seen;
  for (auto& c : combinations(s)) {
    if (!seen.insert(c).second) {
      std::string all;
      for (auto& [k, v] : c) all += (all.empty() ? "" : " ") + k + "=" + v;
      throw ConfigError(s.path + ": two runs have the same overrides (" + all + "); zip rows must differ");
    }
    Run r;
    r.axes = c;
    for (auto& [k, v] : c) r.name += (r.name.empty() ? "" : "_") + labels.at(k) + "=" + sanitize(v);
    ++name_count[r.name];
    runs.push_back(std::move(r));
  }
  for (auto& r : runs)
    if (r.name.size() > kMaxName || name_count[r.name] > 1)
      r.name = r.name.substr(0, std::min(r.name.size(), kMaxName - 9)) + "_" + hash8(r.axes);
  for (auto& r : runs) r.dir = s.dir + "/" + r.name;
  return runs;
}

void plan(const SweepSpec& s, std::vector<Run>& runs, const std::string& bin_dir, int parallel) {
  for (auto& r : runs) plan_run(s, r, bin_dir);
  split_cores(s, runs, parallel);
  if (s.launch.empty()) return;
  for (auto& r : runs) {
    std::vector<std::string> a = {bin_dir + "/launch", "--standalone", "--run-id", r.name,
                                  "--log-dir", r.dir + "/launch_logs"};
    for (auto& [opt, v] : s.launch) a.insert(a.end(), {opt, v});
    a.push_back("--");
    a.insert(a.end(), r.argv.begin(), r.argv.end());
    r.argv = std::move(a);
  }
}

void print_plan(const SweepSpec& s, const std::vector<Run>& runs, int parallel) {
  int done = 0;
  for (auto& r : runs) done += r.state == State::kDone;
  std::printf("sweep %s: %zu runs in %s (base %s), %d done, %zu to run, %d at a time%s\n", s.path.c_str(),
              runs.size(), s.dir.c_str(), s.base.c_str(), done, runs.size() - done, parallel,
              s.launch.empty() ? "" : strf(", %d processes per run (launch)", s.nproc).c_str());
  if (!s.overrides.empty()) {
    std::printf("fixed:");
    for (auto& [k, v] : s.overrides) std::printf(" %s=%s", k.c_str(), v.c_str());
    std::printf("\n");
  }
  size_t w = 3;
  for (auto& r : runs) w = std::max(w, r.name.size());
  std::printf("%4s  %-*s  %-12s  %s\n", "#", static_cast<int>(w), "run", "state", "overrides");
  for (size_t i = 0; i < runs.size(); ++i) {
    std::string ov;
    for (auto& [k, v] : runs[i].axes) ov += (ov.empty() ? "" : " ") + k + "=" + v;
    std::printf("%4zu  %-*s  %-12s  %s\n", i + 1, static_cast<int>(w), runs[i].name.c_str(),
                state_text(runs[i]).c_str(), ov.c_str());
  }
  if (!runs.empty()) std::printf("command of run 1: %s\n", join_command(runs[0].argv).c_str());
}

int64_t newest_checkpoint(const std::string& dir) {
  // Committed checkpoints only (run_dir::list_checkpoints: a save in progress is "*.tmp"), with their manifest.
  for (const auto& [step, path] : run_dir::list_checkpoints(run_dir::checkpoints(dir)))
    if (files::exists(path + "/" + run_dir::kCheckpointManifest)) return step;
  return 0;
}

bool finished(const Run& r) {
  auto j = read_json(run_dir::summary(r.dir));
  return j && j->is_object() && j->contains(records::kSteps) && (*j)[records::kSteps].is_number_integer() &&
         (*j)[records::kSteps].get<int64_t>() == r.cfg.train.max_steps;
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string out;
  for (auto& a : argv) {
    bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+=/:,@") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return out;
}

}  // namespace lm::sweep
