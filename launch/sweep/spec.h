// The sweep file, parsed and checked (the format is described in launch/sweep/main.cpp).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace lm::sweep {

using KV = std::pair<std::string, std::string>;  // dotted key, value text

// One swept key and its values, in file order.
struct Axis {
  std::string key;
  std::vector<std::string> values;
  std::string where;  // "FILE:LINE"
};

struct SweepSpec {
  std::string path;             // the sweep file
  std::string base;             // the experiment file every run starts from
  std::string dir;              // the sweep directory (default runs/<sweep file stem>)
  std::vector<KV> overrides;    // fixed for every run
  std::vector<Axis> grid, zip;  // zip axes all have the same length
  std::vector<std::string> seeds;
  std::vector<KV> launch;       // launch option ("--nproc-per-node") -> value; empty: no launch
  int nproc = 1;                // launch.nproc_per_node
};

// Reads the sweep file at `path`. Throws UsageError when it cannot be opened, ConfigError
// ("FILE:LINE: ...") for YAML syntax, unknown or misplaced keys, bad values, a key set by two
// sections, a missing base file, or nothing to sweep.
SweepSpec parse_sweep(const std::string& path);

}  // namespace lm::sweep
