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
// Run names: see plan.h.
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
//
// Files: spec.h (the sweep file), plan.h (runs, names, configs, commands), runner.h (running them,
// signals, report), summary.h (summary.csv / summary.md).
#include <CLI/CLI.hpp>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "common/dir_lock.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "launch/sweep/plan.h"
#include "launch/sweep/runner.h"
#include "launch/sweep/spec.h"
#include "launch/sweep/summary.h"

namespace lm::sweep {
namespace {

struct CommandLine {
  std::string sweep_path;
  int parallel = 1;
  bool dry_run = false;
};

std::string bin_dir() {
  std::error_code ec;
  auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find the sweep binary's directory (/proc/self/exe)");
  return exe.parent_path().string();
}

// The command line; with --help, the exit code after printing it.
std::optional<int> parse_command_line(int argc, char** argv, CommandLine& c) {
  CLI::App app{
      "Runs a sweep of trainer experiments: grid x zip x seeds over one base config, validated before\n"
      "any run starts, K at a time, resumable, with DIR/summary.csv and summary.md at the end.\n"
      "Sweep file: base, dir, overrides, grid, zip, seeds, launch (see configs/sweep_*.yaml).\n"
      "Relative paths resolve against the current directory.",
      "sweep"};
  app.footer("Exit: 0 all runs done; 1 a run failed or did not finish; 2 bad input (nothing ran);\n"
             "128+signal when interrupted (runs checkpoint and resume on the next sweep).");
  app.add_option("SWEEP", c.sweep_path, "Sweep file (YAML)")->required();
  app.add_option("--parallel,-j", c.parallel, "Runs at a time; the cores are split between them")->capture_default_str();
  app.add_flag("--dry-run,-n", c.dry_run, "Print the runs (name, state, overrides) and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw UsageError(msg);
  }
  if (c.parallel < 1) throw UsageError("--parallel: expected an integer >= 1, got " + std::to_string(c.parallel));
  return std::nullopt;
}

// The binaries the runs need: an Error when one is missing (a warning only for --dry-run).
void check_binaries(const SweepSpec& spec, const std::string& bins, bool dry_run) {
  const bool have_launch = files::exists(bins + "/launch");
  if (dry_run) {
    if (!spec.launch.empty() && !have_launch)
      log::warn(bins + "/launch does not exist: the sweep asks for launch; build the launch target before running");
    return;
  }
  if (!files::exists(bins + "/trainer")) throw Error(bins + "/trainer does not exist; build the trainer target");
  if (!spec.launch.empty() && !have_launch)
    throw Error(bins + "/launch does not exist, but the sweep file asks for multi-process runs (launch:); "
                "build the launch target or remove launch: from the sweep");
}

// Logs the tally of the runs' statuses; returns how many are done.
int tally(const SweepSpec& spec, const std::vector<Run>& runs, int done_before) {
  int ok = 0, failed = 0, stopped = 0, pending = 0;
  for (auto& r : runs) {
    ok += r.status == "done";
    failed += r.status == "failed";
    stopped += r.status == "stopped";
    pending += r.status == "pending";
  }
  log::info(strf("sweep %s: %d done (%d skipped), %d failed, %d stopped, %d not started; summary in %s/summary.md",
                 spec.path.c_str(), ok, done_before, failed, stopped, pending, spec.dir.c_str()));
  return ok;
}

int sweep_main(int argc, char** argv) {
  CommandLine c;
  if (auto code = parse_command_line(argc, argv, c)) return *code;
  const SweepSpec spec = parse_sweep(c.sweep_path);
  std::vector<Run> runs = expand(spec);
  const std::string bins = bin_dir();
  plan(spec, runs, bins, c.parallel);
  if (c.dry_run) {
    print_plan(spec, runs, c.parallel);
    check_binaries(spec, bins, /*dry_run=*/true);
    return kExitOk;
  }
  check_binaries(spec, bins, /*dry_run=*/false);
  files::make_dirs(spec.dir);
  DirLock lock(spec.dir, "sweep.lock", "another sweep");
  files::write_file_atomic(spec.dir + "/sweep.yaml", files::read_file(c.sweep_path));
  install_signal_handlers();
  const int done_before = run_all(spec, runs, c.parallel);
  write_summaries(spec, runs);
  const int done = tally(spec, runs, done_before);
  write_report(spec, runs, bins);
  if (signals_received() > 0) return 128 + last_signal();
  return done == static_cast<int>(runs.size()) ? kExitOk : kExitFailure;
}

}  // namespace
}  // namespace lm::sweep

int main(int argc, char** argv) {
  return lm::run_main("sweep", [&] { return lm::sweep::sweep_main(argc, argv); });
}
