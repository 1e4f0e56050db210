// `sweep`: expands a sweep file into runs of the trainer, validates every run's config before any
// starts, runs them one after another or K at a time (optionally each through `launch`), resumes or
// skips what an earlier invocation left, and tabulates the results.
//
//   sweep SWEEP.yaml [--parallel K] [--dry-run]
//
// The sweep file (every relative path, here and inside the configs, resolves against the current
// directory, as for the trainer: run sweeps from the repository root):
//
//   base: configs/tiny.yaml            # required: the experiment file every run starts from
//   dir: runs/sweep_lr_width           # the sweep directory (default runs/<sweep file stem>)
//   overrides: {train.max_steps: 200}  # fixed "dotted.key: value" for every run
//   grid: {optim.lr: [1e-3, 3e-3], model.d_model: [64, 128]}   # cartesian product
//   zip:  {model.n_head: [2, 4], model.n_layer: [2, 4]}        # taken together (same lengths)
//   seeds: [1, 2]                      # run.seed, innermost axis
//   launch: {nproc_per_node: 2}        # each run through build/bin/launch --standalone
//
// At least one of grid, zip, seeds. Keys may be dotted or nested maps. Runs = product of the grid
// lists x zip length x seeds, in file order (first grid key slowest, seeds fastest). Sections may
// not share a key; run.dir is the sweep's (DIR/<run name>). Launch takes nproc_per_node,
// max_restarts, grace_period, monitor_interval, rdzv_timeout, role (single node only).
//
// Run names: "leaf=value" of each swept key joined by '_' (e.g. lr=0.001_d_model=64_seed=1), the
// full dotted key where two swept keys share a leaf, characters outside [A-Za-z0-9.+-] as '-'.
// A name longer than 96 characters, or one that two runs would share, is cut and gets '_' plus 8
// hex digits of the xxh64 of its "key=value" lines. Names depend only on the values' text.
//
// State of a run directory: done (summary.json with steps == the run's train.max_steps: skipped),
// partial (a checkpoint: the trainer resumes from it, checkpoint.resume: auto), new. A run dir whose
// config.yaml differs from the run's expanded config (beyond operational keys: train.max_steps,
// train.threads, data.workers, data.prefetch, checkpoint.*, log.*, dist.timeout_s) is refused.
//
// Outputs: DIR/sweep.yaml (copy of the sweep file), DIR/<run>/ (the trainer's run directory, plus
// sweep.log: the run's stdout+stderr, appended per attempt between "==== sweep" lines),
// DIR/summary.csv and DIR/summary.md (atomic; sorted by best validation loss, runs without one
// last), DIR/report.html when build/bin/report exists. DIR/sweep.lock keeps two sweeps apart.
//
// Exit: 0 every run done; 2 bad input (sweep file, a run's config, command line; nothing has run);
// 1 a run failed or did not finish, or a runtime error; 128+signal when SIGINT/SIGTERM/SIGHUP
// stopped the sweep (the first one is forwarded once as SIGTERM: trainers checkpoint and exit; a
// second one SIGKILLs them).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "trainer/config.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"

extern char** environ;

namespace lm {
namespace {

namespace stdfs = std::filesystem;
using KV = std::pair<std::string, std::string>;  // dotted key, value text

constexpr size_t kMaxName = 96;

// ---- the sweep file ---------------------------------------------------------------------------

struct Axis {
  std::string key;
  std::vector<std::string> values;
  std::string where;  // "FILE:LINE"
};

struct SweepSpec {
  std::string path;  // the sweep file
  std::string base;
  std::string dir;
  std::vector<KV> overrides;
  std::vector<Axis> grid, zip;
  std::vector<std::string> seeds;
  std::vector<KV> launch;  // option (dashes) -> value
  int nproc = 1;           // launch.nproc_per_node
};

std::string where_of(const std::string& path, const YAML::Node& n) {
  auto m = n.Mark();
  return m.line >= 0 ? path + ":" + std::to_string(m.line + 1) : path;
}

[[noreturn]] void bad(const std::string& where, const std::string& msg) {
  throw ConfigError(where + ": " + msg);
}

std::string scalar_text(const std::string& where, const std::string& what, const YAML::Node& n) {
  if (!n.IsScalar()) bad(where, what + ": expected a single value, got a " + (n.IsMap() ? "map" : n.IsNull() ? "null" : "list"));
  return n.Scalar();
}

// Flattens a (possibly nested) map into dotted keys. Leaves are what is not a map.
void flatten(const std::string& path, const YAML::Node& node, const std::string& prefix,
             std::vector<std::pair<std::string, YAML::Node>>& out) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string key = prefix.empty() ? it->first.as<std::string>() : prefix + "." + it->first.as<std::string>();
    if (it->second.IsMap() && it->second.size() > 0)
      flatten(path, it->second, key, out);
    else
      out.emplace_back(key, it->second);
  }
}

std::vector<Axis> parse_axes(const std::string& path, const std::string& section, const YAML::Node& node) {
  const std::string w = where_of(path, node);
  if (!node.IsMap()) bad(w, section + ": expected a map of dotted.key: [values]");
  std::vector<std::pair<std::string, YAML::Node>> leaves;
  flatten(path, node, "", leaves);
  if (leaves.empty()) bad(w, section + ": empty; give at least one dotted.key: [values] or remove it");
  std::vector<Axis> axes;
  for (auto& [key, v] : leaves) {
    const std::string lw = where_of(path, v);
    if (!v.IsSequence())
      bad(lw, section + " key '" + key + "': expected a list of values, e.g. [1e-3, 3e-3]");
    if (v.size() == 0) bad(lw, section + " key '" + key + "': empty list; give at least one value");
    Axis a{key, {}, lw};
    for (const auto& e : v) {
      std::string s = scalar_text(where_of(path, e), section + " key '" + key + "'", e);
      if (std::find(a.values.begin(), a.values.end(), s) != a.values.end())
        bad(where_of(path, e), section + " key '" + key + "': value '" + s + "' appears twice");
      a.values.push_back(s);
    }
    axes.push_back(std::move(a));
  }
  return axes;
}

// Launch options the sweep passes through (torchrun names, '_' or '-'); the rest are the sweep's.
const std::vector<std::string> kLaunchKeys = {"nproc_per_node", "max_restarts", "grace_period",
                                              "monitor_interval", "rdzv_timeout", "role"};
const std::vector<std::string> kLaunchOwned = {"standalone", "run_id", "rdzv_id", "log_dir"};
const std::vector<std::string> kLaunchMultiNode = {"nnodes", "node_rank", "master_addr", "master_port"};

SweepSpec parse_sweep(const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw UsageError(path + ": cannot open sweep file");
  } catch (const YAML::ParserException& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": YAML syntax error: " + e.msg);
  }
  if (!root.IsMap()) bad(where_of(path, root), "expected a map with base, dir, overrides, grid, zip, seeds, launch");
  static const std::vector<std::string> kTop = {"base", "dir", "overrides", "grid", "zip", "seeds", "launch"};
  SweepSpec s;
  s.path = path;
  // Sections by name (emplaced: yaml-cpp Node assignment rebinds references).
  std::optional<YAML::Node> grid, zip, seeds, overrides, launch;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.as<std::string>(), w = where_of(path, it->first);
    const YAML::Node v = it->second;
    if (key == "base") s.base = scalar_text(w, "base", v);
    else if (key == "dir") s.dir = scalar_text(w, "dir", v);
    else if (key == "overrides") overrides.emplace(v);
    else if (key == "grid") grid.emplace(v);
    else if (key == "zip") zip.emplace(v);
    else if (key == "seeds") seeds.emplace(v);
    else if (key == "launch") launch.emplace(v);
    else bad(w, "unknown key '" + key + "' (did you mean '" + closest_match(key, kTop) + "'?)");
  }
  if (s.base.empty()) bad(path, "base: missing; name the experiment file every run starts from");
  if (!files::exists(s.base))
    bad(path, "base: " + s.base + ": no such file (relative paths resolve against the current directory " +
                  stdfs::current_path().string() + ")");
  if (s.dir.empty()) s.dir = "runs/" + stdfs::path(path).stem().string();
  while (s.dir.size() > 1 && s.dir.back() == '/') s.dir.pop_back();

  if (overrides) {
    if (!overrides->IsMap()) bad(where_of(path, *overrides), "overrides: expected a map of dotted.key: value");
    std::vector<std::pair<std::string, YAML::Node>> leaves;
    flatten(path, *overrides, "", leaves);
    for (auto& [key, v] : leaves) {
      if (v.IsSequence()) bad(where_of(path, v), "overrides key '" + key + "' holds a list; put swept values under grid or zip");
      s.overrides.emplace_back(key, v.IsNull() ? "" : v.Scalar());
    }
  }
  if (grid) s.grid = parse_axes(path, "grid", *grid);
  if (zip) {
    s.zip = parse_axes(path, "zip", *zip);
    for (auto& a : s.zip)
      if (a.values.size() != s.zip[0].values.size())
        bad(a.where, "zip: '" + a.key + "' has " + std::to_string(a.values.size()) + " values but '" +
                         s.zip[0].key + "' has " + std::to_string(s.zip[0].values.size()) + "; zip lists must have the same length");
  }
  if (seeds) {
    const std::string w = where_of(path, *seeds);
    if (!seeds->IsSequence()) bad(w, "seeds: expected a list of integers, e.g. [1, 2]");
    if (seeds->size() == 0) bad(w, "seeds: empty list; give at least one seed or remove it");
    for (const auto& e : *seeds) {
      std::string v = scalar_text(where_of(path, e), "seeds", e);
      if (std::find(s.seeds.begin(), s.seeds.end(), v) != s.seeds.end()) bad(where_of(path, e), "seeds: '" + v + "' appears twice");
      s.seeds.push_back(v);
    }
  }
  if (s.grid.empty() && s.zip.empty() && s.seeds.empty())
    bad(path, "nothing to sweep: give at least one of grid, zip, seeds");

  // One owner per key.
  std::map<std::string, std::string> owner;
  auto own = [&](const std::string& key, const std::string& section, const std::string& w) {
    if (key == "run.dir") bad(w, section + ": run.dir is set by the sweep (dir: + run name); remove it");
    auto [it, fresh] = owner.emplace(key, section);
    if (!fresh) bad(w, "key '" + key + "' is set by both " + it->second + " and " + section);
  };
  for (auto& [k, v] : s.overrides) own(k, "overrides", path);
  for (auto& a : s.grid) own(a.key, "grid", a.where);
  for (auto& a : s.zip) own(a.key, "zip", a.where);
  if (!s.seeds.empty()) own("run.seed", "seeds", where_of(path, *seeds));

  if (launch) {
    const std::string w = where_of(path, *launch);
    if (!launch->IsMap()) bad(w, "launch: expected a map of launch options, e.g. {nproc_per_node: 2}");
    for (auto it = launch->begin(); it != launch->end(); ++it) {
      std::string key = it->first.as<std::string>(), lw = where_of(path, it->first);
      std::replace(key.begin(), key.end(), '-', '_');
      auto in = [&](const std::vector<std::string>& l) { return std::find(l.begin(), l.end(), key) != l.end(); };
      if (in(kLaunchOwned)) bad(lw, "launch." + key + " is set by the sweep (--standalone, --run-id <run>, --log-dir <run dir>/launch_logs)");
      if (in(kLaunchMultiNode)) bad(lw, "launch." + key + ": multi-node sweeps are not supported; runs use launch --standalone on this node");
      if (!in(kLaunchKeys)) bad(lw, "launch: unknown option '" + key + "' (did you mean '" + closest_match(key, kLaunchKeys) + "'?)");
      std::string v = scalar_text(lw, "launch." + key, it->second);
      if (key == "nproc_per_node") {
        char* end = nullptr;
        long n = std::strtol(v.c_str(), &end, 10);
        if (v.empty() || *end != '\0' || n < 1 || n > 4096)
          bad(lw, "launch.nproc_per_node: expected an integer >= 1, got '" + v + "'");
        s.nproc = static_cast<int>(n);
      }
      std::string opt = key;
      std::replace(opt.begin(), opt.end(), '_', '-');
      s.launch.emplace_back("--" + opt, v);
    }
  }
  return s;
}

// ---- runs -------------------------------------------------------------------------------------

enum class State { kNew, kPartial, kDone };

struct Run {
  std::string name;
  std::vector<KV> axes;   // swept key=value, in axis order
  std::string dir;        // DIR/name
  ExperimentConfig cfg;   // expanded and validated
  std::vector<std::string> argv;  // the full command
  int threads = 0;        // OMP_NUM_THREADS for the child; 0 = leave the environment alone
  State state = State::kNew;
  int64_t resume_step = 0;  // kPartial: the newest checkpoint
  // This invocation's outcome.
  std::string status = "pending";  // done | failed | stopped | pending
  int exit_code = -1;              // -1 = not run now
  std::string exit_text;           // "exit 2", "SIGKILL", ...
  bool skipped = false;
};

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

// Expands the axes into runs (names and swept overrides only), in file order.
std::vector<Run> expand(const SweepSpec& s) {
  std::vector<std::string> keys;
  for (auto& a : s.grid) keys.push_back(a.key);
  for (auto& a : s.zip) keys.push_back(a.key);
  if (!s.seeds.empty()) keys.push_back("run.seed");
  std::map<std::string, int> leaf_count;
  for (auto& k : keys) ++leaf_count[leaf_of(k)];
  auto label = [&](const std::string& k) { return leaf_count[leaf_of(k)] > 1 ? k : leaf_of(k); };

  // Factors of the product, outermost first: one per grid key, the zip rows, the seeds.
  using Rows = std::vector<std::vector<KV>>;
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
    for (auto& v : s.seeds) rows.push_back({{"run.seed", v}});
    factors.push_back(std::move(rows));
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

  std::vector<Run> runs;
  std::map<std::string, int> name_count;
  std::set<std::vector<KV>> seen;
  for (auto& c : combos) {
    if (!seen.insert(c).second) {
      std::string all;
      for (auto& [k, v] : c) all += (all.empty() ? "" : " ") + k + "=" + v;
      bad(s.path, "two runs have the same overrides (" + all + "); zip rows must differ");
    }
    Run r;
    r.axes = c;
    for (auto& [k, v] : c) r.name += (r.name.empty() ? "" : "_") + label(k) + "=" + sanitize(v);
    ++name_count[r.name];
    runs.push_back(std::move(r));
  }
  for (auto& r : runs)
    if (r.name.size() > kMaxName || name_count[r.name] > 1)
      r.name = r.name.substr(0, std::min(r.name.size(), kMaxName - 9)) + "_" + hash8(r.axes);
  for (auto& r : runs) r.dir = s.dir + "/" + r.name;
  return runs;
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

// The newest checkpoint step with a manifest (the trainer's commit marker), 0 if none.
int64_t newest_checkpoint(const std::string& run_dir) {
  int64_t best = 0;
  std::error_code ec;
  for (auto& e : stdfs::directory_iterator(run_dir + "/checkpoints", ec)) {
    const std::string n = e.path().filename().string();
    // Committed checkpoints only: "step_<digits>" (a save in progress is "step_<N>.tmp").
    if (n.size() <= 5 || n.rfind("step_", 0) != 0 || n.find_first_not_of("0123456789", 5) != std::string::npos ||
        !files::exists(e.path().string() + "/manifest.json"))
      continue;
    best = std::max<int64_t>(best, std::atoll(n.c_str() + 5));
  }
  return best;
}

std::optional<nlohmann::json> read_json(const std::string& path) {
  if (!files::exists(path)) return std::nullopt;
  std::ifstream in(path);
  auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// Finished: summary.json says the run reached its train.max_steps (a stopped run writes one too).
bool finished(const Run& r) {
  auto j = read_json(r.dir + "/summary.json");
  return j && j->is_object() && j->contains("steps") && (*j)["steps"].is_number_integer() &&
         (*j)["steps"].get<int64_t>() == r.cfg.train.max_steps;
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
  const std::string path = r.dir + "/config.yaml";
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

// Validates every run (nothing has started yet) and fills cfg, argv, threads, state.
void plan(const SweepSpec& s, std::vector<Run>& runs, const std::string& bin_dir, int parallel) {
  for (auto& r : runs) {
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
  int todo = 0;
  for (auto& r : runs) todo += r.state != State::kDone;
  const int together = std::min(parallel, std::max(todo, 1));
  if (together > 1) {
    const int threads = std::max(1, usable_cores() / (together * s.nproc));
    for (auto& r : runs) {
      r.threads = threads;
      if (r.cfg.train.threads == 0) {  // not chosen by the user
        r.argv.push_back("train.threads=" + std::to_string(threads));
        r.cfg.train.threads = threads;
      }
    }
  }
  if (!s.launch.empty()) {
    for (auto& r : runs) {
      std::vector<std::string> a = {bin_dir + "/launch", "--standalone", "--run-id", r.name,
                                    "--log-dir", r.dir + "/launch_logs"};
      for (auto& [opt, v] : s.launch) a.insert(a.end(), {opt, v});
      a.push_back("--");
      a.insert(a.end(), r.argv.begin(), r.argv.end());
      r.argv = std::move(a);
    }
  }
}

// ---- metrics and summaries --------------------------------------------------------------------

struct RunStats {
  int64_t steps = -1;          // last train step logged, or the newest checkpoint if later
  double train_loss = NAN;     // its loss
  double best_val = NAN;       // min val_loss
  int64_t best_val_step = -1;
  double tokens_per_s = NAN;   // mean over train records, the first one (warm-up) left out
};

RunStats read_stats(const std::string& run_dir) {
  RunStats st;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::vector<double> tps;
  for (std::string line; std::getline(in, line);) {
    try {  // a line cut by a crash, or of another shape, is left out
      auto j = nlohmann::json::parse(line);
      const std::string kind = j.value("kind", "");
      if (kind == "train" && j.contains("step")) {
        st.steps = j["step"].get<int64_t>();
        st.train_loss = j.value("loss", NAN);
        if (j.contains("tokens_per_s")) tps.push_back(j["tokens_per_s"].get<double>());
      } else if (kind == "val" && j.contains("val_loss")) {
        const double v = j["val_loss"].get<double>();
        if (std::isfinite(v) && (std::isnan(st.best_val) || v < st.best_val))
          st.best_val = v, st.best_val_step = j.value("step", int64_t{-1});
      }
    } catch (const nlohmann::json::exception&) {
    }
  }
  st.steps = std::max(st.steps, newest_checkpoint(run_dir));  // a stop checkpoints past the last log
  if (tps.size() > 1) tps.erase(tps.begin());
  if (!tps.empty()) {
    double sum = 0;
    for (double t : tps) sum += t;
    st.tokens_per_s = sum / static_cast<double>(tps.size());
  }
  return st;
}

std::string num(double v, const char* fmt) { return std::isfinite(v) ? strf(fmt, v) : ""; }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

std::string md_cell(const std::string& s) {
  std::string o;
  for (char c : s) o += c == '|' ? std::string("\\|") : std::string(1, c);
  return o;
}

std::string status_text(const Run& r) {
  return r.status == "failed" ? "failed (" + r.exit_text + ")" : r.status;
}

// Rows sorted by best validation loss, runs without one last (otherwise in sweep order).
void write_summaries(const SweepSpec& s, const std::vector<Run>& runs) {
  std::vector<RunStats> stats;
  for (auto& r : runs) stats.push_back(read_stats(r.dir));
  std::vector<size_t> order(runs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    bool ha = std::isfinite(stats[a].best_val), hb = std::isfinite(stats[b].best_val);
    if (ha != hb) return ha;
    return ha && stats[a].best_val < stats[b].best_val;
  });
  std::vector<std::string> keys;
  for (auto& [k, v] : runs.front().axes) keys.push_back(k);

  std::ostringstream csv;
  csv << "run";
  for (auto& k : keys) csv << "," << csv_field(k);
  csv << ",status,exit_code,steps,max_steps,final_train_loss,best_val_loss,best_val_step,mean_tokens_per_s,run_dir\n";
  std::ostringstream md;
  md << "# Sweep " << s.dir << "\n\n";
  md << "Sweep file `" << s.path << "`, base `" << s.base << "`";
  if (!s.overrides.empty()) {
    md << ", fixed overrides:";
    for (auto& [k, v] : s.overrides) md << " `" << k << "=" << v << "`";
  }
  md << ". Sorted by best validation loss (runs without one last); tokens/s is the mean of the "
        "logged train windows after the first.\n\n";
  md << "| run |";
  for (auto& k : keys) md << " " << md_cell(k) << " |";
  md << " status | steps | final train loss | best val loss | tokens/s |\n|---|";
  for (size_t i = 0; i < keys.size(); ++i) md << "---|";
  md << "---|---:|---:|---:|---:|\n";
  for (size_t i : order) {
    const Run& r = runs[i];
    const RunStats& st = stats[i];
    const std::string steps = st.steps >= 0 ? std::to_string(st.steps) : "";
    csv << csv_field(r.name);
    for (auto& kv : r.axes) csv << "," << csv_field(kv.second);
    csv << "," << r.status << "," << (r.exit_code >= 0 ? std::to_string(r.exit_code) : "") << "," << steps << ","
        << r.cfg.train.max_steps << "," << num(st.train_loss, "%.6g") << "," << num(st.best_val, "%.6g") << ","
        << (st.best_val_step >= 0 ? std::to_string(st.best_val_step) : "") << "," << num(st.tokens_per_s, "%.1f")
        << "," << csv_field(r.dir) << "\n";
    md << "| " << md_cell(r.name) << " |";
    for (auto& kv : r.axes) md << " " << md_cell(kv.second) << " |";
    md << " " << status_text(r) << " | " << (steps.empty() ? "" : steps + "/" + std::to_string(r.cfg.train.max_steps))
       << " | " << num(st.train_loss, "%.4f") << " | " << num(st.best_val, "%.4f") << " | "
       << num(st.tokens_per_s, "%.0f") << " |\n";
  }
  files::write_file_atomic(s.dir + "/summary.csv", csv.str());
  files::write_file_atomic(s.dir + "/summary.md", md.str());
}

// ---- processes --------------------------------------------------------------------------------

std::atomic<int> g_signal{0}, g_signal_count{0};
extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  g_signal_count.fetch_add(1);
}

std::string signal_name(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string now_text() {
  std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

void append_line(const std::string& path, const std::string& line) {
  std::ofstream(path, std::ios::app) << line << "\n";
}

std::string join_command(const std::vector<std::string>& argv) {
  std::string out;
  for (auto& a : argv) {
    bool plain = !a.empty() && a.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+=/:,@") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? a : "'" + a + "'");
  }
  return out;
}

// The last non-empty line of a file that is not one of the sweep's own "====" lines.
std::string last_output_line(const std::string& path) {
  std::ifstream in(path);
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos && line.rfind("==== sweep", 0) != 0) last = line;
  return last;
}

// Starts argv[0] with stdout+stderr appended to `log`, in its own process group (a terminal's ^C
// reaches only the sweep, which forwards one SIGTERM), SIGTERMed if the sweep dies.
pid_t start_child(const std::vector<std::string>& argv, const std::string& log, int threads) {
  std::vector<std::string> env_s;
  for (char** e = environ; *e; ++e) env_s.emplace_back(*e);
  if (threads > 0)
    for (const char* var : {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"})
      if (!std::getenv(var)) env_s.push_back(std::string(var) + "=" + std::to_string(threads));
  std::vector<char*> envp, args;
  for (auto& e : env_s) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  for (auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(log + ": cannot open for writing: " + std::strerror(errno));
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    throw Error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(1);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    const int null_fd = ::open("/dev/null", O_RDONLY);
    if (null_fd >= 0) ::dup2(null_fd, 0);
    ::execve(args[0], args.data(), envp.data());
    std::fprintf(stderr, "sweep: cannot execute %s: %s\n", args[0], std::strerror(errno));
    ::_exit(127);
  }
  ::close(fd);
  return pid;
}

// ---- the sweep --------------------------------------------------------------------------------

std::string bin_dir() {
  std::error_code ec;
  auto exe = stdfs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find the sweep binary's directory (/proc/self/exe)");
  return exe.parent_path().string();
}

std::string state_text(const Run& r) {
  switch (r.state) {
    case State::kDone: return "done";
    case State::kPartial: return "resume@" + std::to_string(r.resume_step);
    default: return files::exists(r.dir) ? "restart" : "new";
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

// A run's outcome from its exit status and its run directory.
void finish_run(Run& r, int status, double secs, size_t idx, size_t total) {
  const std::string log_path = r.dir + "/sweep.log";
  if (WIFEXITED(status)) {
    r.exit_code = WEXITSTATUS(status);
    r.exit_text = "exit " + std::to_string(r.exit_code);
  } else {
    r.exit_code = 128 + WTERMSIG(status);
    r.exit_text = signal_name(WTERMSIG(status));
  }
  append_line(log_path, strf("==== sweep %s: %s after %.1f s", now_text().c_str(), r.exit_text.c_str(), secs));
  const std::string tag = strf("[%zu/%zu]", idx + 1, total);
  if (r.exit_code == 0 && finished(r)) {
    r.status = "done";
    RunStats st = read_stats(r.dir);
    log::info(strf("%s done  %s in %.1f s: %lld steps, loss %s, best val %s", tag.c_str(), r.name.c_str(), secs,
                   (long long)st.steps, num(st.train_loss, "%.4f").c_str(),
                   std::isfinite(st.best_val) ? num(st.best_val, "%.4f").c_str() : "-"));
  } else if (r.exit_code == 0) {
    r.status = "stopped";
    log::warn(strf("%s stopped %s after %.1f s at step %lld of %lld (resumes on the next sweep)", tag.c_str(),
                   r.name.c_str(), secs, (long long)read_stats(r.dir).steps, (long long)r.cfg.train.max_steps));
  } else if (g_signal_count.load() > 0) {
    r.status = "stopped";
    log::warn(strf("%s stopped %s by %s after %.1f s (resumes on the next sweep)", tag.c_str(), r.name.c_str(),
                   r.exit_text.c_str(), secs));
  } else {
    r.status = "failed";
    log::error(strf("%s FAIL  %s: %s after %.1f s: %s (log: %s)", tag.c_str(), r.name.c_str(), r.exit_text.c_str(),
                    secs, last_output_line(log_path).c_str(), log_path.c_str()));
  }
}

// Holds DIR/sweep.lock (flock) for the life of the sweep: one sweep per directory at a time.
class DirLock {
 public:
  explicit DirLock(const std::string& dir) {
    const std::string path = dir + "/sweep.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error(path + ": cannot open: " + std::strerror(errno));
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      char buf[32] = {0};
      ssize_t n = ::pread(fd_, buf, sizeof buf - 1, 0);
      std::string holder = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
      holder.erase(holder.find_last_not_of("\n ") + 1);
      throw UsageError(dir + " is in use by another sweep (pid " + holder + "); wait for it or stop it");
    }
    std::string pid = std::to_string(::getpid()) + "\n";
    if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) { /* informational only */ }
  }
  ~DirLock() { ::close(fd_); }
  DirLock(const DirLock&) = delete;
  DirLock& operator=(const DirLock&) = delete;

 private:
  int fd_ = -1;
};

int sweep_main(int argc, char** argv) {
  CLI::App app{
      "Runs a sweep of trainer experiments: grid x zip x seeds over one base config, validated before\n"
      "any run starts, K at a time, resumable, with DIR/summary.csv and summary.md at the end.\n"
      "Sweep file: base, dir, overrides, grid, zip, seeds, launch (see configs/sweep_*.yaml).\n"
      "Relative paths resolve against the current directory.",
      "sweep"};
  app.footer("Exit: 0 all runs done; 1 a run failed or did not finish; 2 bad input (nothing ran);\n"
             "128+signal when interrupted (runs checkpoint and resume on the next sweep).");
  std::string sweep_path;
  int parallel = 1;
  bool dry_run = false;
  app.add_option("SWEEP", sweep_path, "Sweep file (YAML)")->required();
  app.add_option("--parallel,-j", parallel, "Runs at a time; the cores are split between them")->capture_default_str();
  app.add_flag("--dry-run,-n", dry_run, "Print the runs (name, state, overrides) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw UsageError(msg);
  }
  if (parallel < 1) throw UsageError("--parallel: expected an integer >= 1, got " + std::to_string(parallel));

  const SweepSpec spec = parse_sweep(sweep_path);
  std::vector<Run> runs = expand(spec);
  const std::string bins = bin_dir();
  plan(spec, runs, bins, parallel);
  const bool have_launch = files::exists(bins + "/launch");
  if (dry_run) {
    print_plan(spec, runs, parallel);
    if (!spec.launch.empty() && !have_launch)
      log::warn(bins + "/launch does not exist: the sweep asks for launch; build the launch target before running");
    return kExitOk;
  }
  if (!files::exists(bins + "/trainer")) throw Error(bins + "/trainer does not exist; build the trainer target");
  if (!spec.launch.empty() && !have_launch)
    throw Error(bins + "/launch does not exist, but the sweep file asks for multi-process runs (launch:); "
                "build the launch target or remove launch: from the sweep");

  files::make_dirs(spec.dir);
  DirLock lock(spec.dir);
  files::write_file_atomic(spec.dir + "/sweep.yaml", files::read_file(sweep_path));

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);

  std::vector<size_t> queue;
  int done_before = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].state == State::kDone) {
      runs[i].status = "done", runs[i].skipped = true, ++done_before;
      log::info(strf("[%zu/%zu] skip  %s (done: %lld steps)", i + 1, runs.size(), runs[i].name.c_str(),
                     (long long)runs[i].cfg.train.max_steps));
    } else {
      queue.push_back(i);
    }
  }
  log::info(strf("sweep %s: %zu runs, %d done, %zu to run, %d at a time%s in %s", spec.path.c_str(), runs.size(),
                 done_before, queue.size(), std::min<int>(parallel, std::max<int>(1, static_cast<int>(queue.size()))),
                 queue.empty() || runs[queue[0]].threads == 0 ? "" : strf(", %d threads each", runs[queue[0]].threads).c_str(),
                 spec.dir.c_str()));

  struct Running {
    size_t idx;
    std::chrono::steady_clock::time_point t0;
  };
  std::map<pid_t, Running> running;
  size_t next = 0;
  int forwarded = 0;  // signals forwarded to the children: 1 = SIGTERM, 2 = SIGKILL
  while (next < queue.size() || !running.empty()) {
    const int nsig = g_signal_count.load();
    if (nsig > forwarded && !running.empty()) {
      const int sig = nsig == 1 ? SIGTERM : SIGKILL;
      log::warn(strf("%s: %s to %zu running run(s)%s", signal_name(g_signal.load()).c_str(), signal_name(sig).c_str(),
                     running.size(), sig == SIGTERM ? " (they checkpoint and stop; again to kill them)" : ""));
      for (auto& [pid, ru] : running) ::kill(pid, sig);
      forwarded = std::min(nsig, 2);
    }
    while (nsig == 0 && next < queue.size() && static_cast<int>(running.size()) < parallel) {
      Run& r = runs[queue[next]];
      files::make_dirs(r.dir);
      const std::string log_path = r.dir + "/sweep.log";
      append_line(log_path, "==== sweep " + now_text() + ": " +
                                (r.state == State::kPartial ? "resume from step " + std::to_string(r.resume_step) : "start") +
                                ": " + join_command(r.argv));
      const pid_t pid = start_child(r.argv, log_path, r.threads);
      log::info(strf("[%zu/%zu] start %s (%s, pid %d)", queue[next] + 1, runs.size(), r.name.c_str(),
                     r.state == State::kPartial ? ("resume@" + std::to_string(r.resume_step)).c_str() : "new",
                     static_cast<int>(pid)));
      running[pid] = {queue[next], std::chrono::steady_clock::now()};
      ++next;
    }
    if (nsig > 0 && running.empty()) break;
    for (auto it = running.begin(); it != running.end();) {
      int st = 0;
      const pid_t r = ::waitpid(it->first, &st, WNOHANG);
      if (r == it->first) {
        const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - it->second.t0).count();
        finish_run(runs[it->second.idx], st, secs, it->second.idx, runs.size());
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    if (!running.empty() || (nsig > 0 && running.empty())) ::usleep(50 * 1000);
  }

  write_summaries(spec, runs);
  int ok = 0, failed = 0, stopped = 0, pending = 0;
  for (auto& r : runs) {
    ok += r.status == "done";
    failed += r.status == "failed";
    stopped += r.status == "stopped";
    pending += r.status == "pending";
  }
  log::info(strf("sweep %s: %d done (%d skipped), %d failed, %d stopped, %d not started; summary in %s/summary.md",
                 spec.path.c_str(), ok, done_before, failed, stopped, pending, spec.dir.c_str()));

  // The HTML report, when the report tool is built.
  if (files::exists(bins + "/report") && g_signal_count.load() == 0) {
    std::vector<std::string> a = {bins + "/report"};
    for (auto& r : runs)
      if (files::exists(r.dir + "/metrics.jsonl")) a.push_back(r.dir);
    a.insert(a.end(), {"-o", spec.dir + "/report.html"});
    if (a.size() > 3) {
      const std::string log_path = spec.dir + "/report.log";
      std::ofstream(log_path, std::ios::trunc) << "==== sweep " << now_text() << ": " << join_command(a) << "\n";
      int st = 0;
      const pid_t pid = start_child(a, log_path, 0);
      while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
      if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
        log::info("report: " + spec.dir + "/report.html");
      else
        log::warn("report failed (" + (WIFEXITED(st) ? "exit " + std::to_string(WEXITSTATUS(st)) : signal_name(WTERMSIG(st))) +
                  "): " + last_output_line(log_path) + " (log: " + log_path + ")");
    }
  } else if (!files::exists(bins + "/report")) {
    log::info("no report tool (" + bins + "/report): skipping report.html");
  }

  if (g_signal_count.load() > 0) return 128 + g_signal.load();
  return ok == static_cast<int>(runs.size()) ? kExitOk : kExitFailure;
}

}  // namespace
}  // namespace lm

int main(int argc, char** argv) {
  return lm::run_main("sweep", [&] { return lm::sweep_main(argc, argv); });
}
