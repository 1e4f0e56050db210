// The sweep file (see spec.h): YAML -> SweepSpec, every error naming FILE:LINE.
#include "launch/sweep/spec.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>

#include "common/errors.h"
#include "common/files.h"
#include "common/text.h"
#include "run/config/config_yaml.h"

namespace lm::sweep {
namespace {

namespace stdfs = std::filesystem;
using Leaves = std::vector<std::pair<std::string, YAML::Node>>;

// Launch options the sweep passes through (torchrun names, '_' or '-'); the rest are the sweep's.
const std::vector<std::string> kLaunchKeys = {"nproc_per_node", "max_restarts", "grace_period",
                                              "monitor_interval", "rdzv_timeout", "role"};
const std::vector<std::string> kLaunchOwned = {"standalone", "run_id", "rdzv_id", "log_dir"};
const std::vector<std::string> kLaunchMultiNode = {"nnodes", "node_rank", "master_addr", "master_port",
                                                   "rdzv_endpoint"};

// The top-level sections that need more than one value, by name.
struct Sections {
  // emplaced, not assigned: yaml-cpp Node assignment rebinds references
  std::optional<YAML::Node> grid, zip, seeds, overrides, launch;
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
void flatten(const YAML::Node& node, const std::string& prefix, Leaves& out) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    std::string key = prefix.empty() ? it->first.as<std::string>() : prefix + "." + it->first.as<std::string>();
    if (it->second.IsMap() && it->second.size() > 0)
      flatten(it->second, key, out);
    else
      out.emplace_back(key, it->second);
  }
}

std::vector<Axis> parse_axes(const std::string& path, const std::string& section, const YAML::Node& node) {
  const std::string w = where_of(path, node);
  if (!node.IsMap()) bad(w, section + ": expected a map of dotted.key: [values]");
  Leaves leaves;
  flatten(node, "", leaves);
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

// base and dir into `s`; the other sections by name. Rejects unknown keys and a missing base.
Sections read_top_level(const std::string& path, const YAML::Node& root, SweepSpec& s) {
  if (!root.IsMap()) bad(where_of(path, root), "expected a map with base, dir, overrides, grid, zip, seeds, launch");
  static const std::vector<std::string> kTop = {"base", "dir", "overrides", "grid", "zip", "seeds", "launch"};
  Sections sec;
  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string key = it->first.as<std::string>(), w = where_of(path, it->first);
    const YAML::Node v = it->second;
    if (key == "base") s.base = scalar_text(w, "base", v);
    else if (key == "dir") s.dir = scalar_text(w, "dir", v);
    else if (key == "overrides") sec.overrides.emplace(v);
    else if (key == "grid") sec.grid.emplace(v);
    else if (key == "zip") sec.zip.emplace(v);
    else if (key == "seeds") sec.seeds.emplace(v);
    else if (key == "launch") sec.launch.emplace(v);
    else bad(w, "unknown key '" + key + "' (did you mean '" + closest_match(key, kTop) + "'?)");
  }
  if (s.base.empty()) bad(path, "base: missing; name the experiment file every run starts from");
  if (!files::exists(s.base))
    bad(path, "base: " + s.base + ": no such file (relative paths resolve against the current directory " +
                  stdfs::current_path().string() + ")");
  if (s.dir.empty()) s.dir = "runs/" + stdfs::path(path).stem().string();
  while (s.dir.size() > 1 && s.dir.back() == '/') s.dir.pop_back();
  return sec;
}

void parse_overrides(const std::string& path, const YAML::Node& node, SweepSpec& s) {
  if (!node.IsMap()) bad(where_of(path, node), "overrides: expected a map of dotted.key: value");
  Leaves leaves;
  flatten(node, "", leaves);
  for (auto& [key, v] : leaves) {
    if (v.IsSequence()) bad(where_of(path, v), "overrides key '" + key + "' holds a list; put swept values under grid or zip");
    s.overrides.emplace_back(key, v.IsNull() ? "" : v.Scalar());
  }
}

void parse_zip(const std::string& path, const YAML::Node& node, SweepSpec& s) {
  s.zip = parse_axes(path, "zip", node);
  for (auto& a : s.zip)
    if (a.values.size() != s.zip[0].values.size())
      bad(a.where, "zip: '" + a.key + "' has " + std::to_string(a.values.size()) + " values but '" + s.zip[0].key +
                       "' has " + std::to_string(s.zip[0].values.size()) + "; zip lists must have the same length");
}

void parse_seeds(const std::string& path, const YAML::Node& node, SweepSpec& s) {
  const std::string w = where_of(path, node);
  if (!node.IsSequence()) bad(w, "seeds: expected a list of integers, e.g. [1, 2]");
  if (node.size() == 0) bad(w, "seeds: empty list; give at least one seed or remove it");
  for (const auto& e : node) {
    std::string v = scalar_text(where_of(path, e), "seeds", e);
    if (std::find(s.seeds.begin(), s.seeds.end(), v) != s.seeds.end()) bad(where_of(path, e), "seeds: '" + v + "' appears twice");
    s.seeds.push_back(v);
  }
}

// One owner per key: a key set by two sections (or run.dir, which is the sweep's) is refused.
void check_owners(const std::string& path, const SweepSpec& s, const std::optional<YAML::Node>& seeds) {
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
}

void parse_launch(const std::string& path, const YAML::Node& node, SweepSpec& s) {
  const std::string w = where_of(path, node);
  if (!node.IsMap()) bad(w, "launch: expected a map of launch options, e.g. {nproc_per_node: 2}");
  for (auto it = node.begin(); it != node.end(); ++it) {
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

}  // namespace

SweepSpec parse_sweep(const std::string& path) {
  const YAML::Node root = load_yaml_file(path, "sweep file");
  SweepSpec s;
  s.path = path;
  try {  // yaml-cpp's own errors (e.g. a list or map as a key, found by tests/fuzz) name the line too
    const Sections sec = read_top_level(path, root, s);
    if (sec.overrides) parse_overrides(path, *sec.overrides, s);
    if (sec.grid) s.grid = parse_axes(path, "grid", *sec.grid);
    if (sec.zip) parse_zip(path, *sec.zip, s);
    if (sec.seeds) parse_seeds(path, *sec.seeds, s);
    if (s.grid.empty() && s.zip.empty() && s.seeds.empty())
      bad(path, "nothing to sweep: give at least one of grid, zip, seeds");
    check_owners(path, s, sec.seeds);
    if (sec.launch) parse_launch(path, *sec.launch, s);
  } catch (const YAML::Exception& e) {
    throw ConfigError(path + ":" + std::to_string(e.mark.line + 1) + ": " + e.msg + " (keys are plain names)");
  }
  return s;
}

}  // namespace lm::sweep
