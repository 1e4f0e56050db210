// The runs of a sweep: the expansion of grid x zip x seeds into named runs, each run's validated
// config and command line, and what an earlier sweep left in its directory.
//
// Run names: "leaf=value" of each swept key joined by '_' (e.g. lr=0.001_d_model=64_seed=1), the
// full dotted key where two swept keys share a leaf, characters outside [A-Za-z0-9.+-] as '-'.
// A name longer than 96 characters, or one that two runs would share, is cut and gets '_' plus 8
// hex digits of the xxh64 of its "key=value" lines. Names depend only on the values' text.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launch/sweep/spec.h"
#include "run/config/config.h"

namespace lm::sweep {

// What the run directory holds at the start of this sweep.
enum class State {
  kNew,      // nothing usable: the run starts from scratch
  kPartial,  // a committed checkpoint: the trainer resumes from it (checkpoint.resume: auto)
  kDone,     // summary.json with steps == train.max_steps: skipped
};

struct Run {
  std::string name;
  std::vector<KV> axes;           // swept key=value, in axis order
  std::string dir;                // DIR/name
  ExperimentConfig cfg;           // expanded and validated
  std::vector<std::string> argv;  // the full command
  int threads = 0;                // OMP_NUM_THREADS for the child; 0 = leave the environment alone
  State state = State::kNew;
  int64_t resume_step = 0;        // kPartial: the newest checkpoint
  // This invocation's outcome.
  std::string status = "pending";  // done | failed | stopped | pending
  int exit_code = -1;              // -1 = not run now
  std::string exit_text;           // "exit 2", "SIGKILL", ...
  bool skipped = false;
};

// The runs of `s` (names, dirs and swept overrides only), in file order: first grid key slowest,
// seeds fastest. Throws ConfigError when two runs would have the same overrides.
std::vector<Run> expand(const SweepSpec& s);

// Validates every run's config (nothing has started yet) and fills cfg, argv, threads and state.
// `bin_dir` holds trainer (and launch); `parallel` runs at a time share the cores. Throws
// ConfigError naming the run for a bad config, or a run dir made with a different config.
void plan(const SweepSpec& s, std::vector<Run>& runs, const std::string& bin_dir, int parallel);

// The --dry-run table: one line per run with its name, state and overrides, and run 1's command.
void print_plan(const SweepSpec& s, const std::vector<Run>& runs, int parallel);

// The newest committed checkpoint step in a run directory, 0 if none.
int64_t newest_checkpoint(const std::string& run_dir);
// Whether the run's summary.json says it reached its train.max_steps (a stopped run writes one too).
bool finished(const Run& r);
// argv as one shell-like line, quoting what is not plain.
std::string join_command(const std::vector<std::string>& argv);

}  // namespace lm::sweep
