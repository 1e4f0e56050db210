// Running a sweep's runs: K at a time as child processes (common/process.h), each with stdout and
// stderr appended to RUN_DIR/sweep.log between "==== sweep" lines; the outcome of each from its
// exit status and its run directory; signal forwarding; and the HTML report at the end.
//
// Signals: after install_signal_handlers(), the first SIGINT/SIGTERM/SIGHUP stops new runs and is
// forwarded once as SIGTERM to the running ones (trainers checkpoint and exit); a second one
// SIGKILLs them. Each run is in its own process group, so a terminal's ^C reaches only the sweep,
// and gets SIGTERM if the sweep dies.
#pragma once

#include <string>
#include <vector>

#include "launch/sweep/plan.h"
#include "launch/sweep/spec.h"

namespace lm::sweep {

void install_signal_handlers();
// How many of SIGINT/SIGTERM/SIGHUP arrived so far, and the last one (0 when none).
int signals_received();
int last_signal();

// Runs every run of `runs` not done yet, `parallel` at a time, until all ended or a signal stopped
// the sweep; sets each run's status, exit_code and exit_text. Logs a line per run. Returns the
// number of runs skipped because an earlier sweep finished them.
int run_all(const SweepSpec& spec, std::vector<Run>& runs, int parallel);

// DIR/report.html from the runs' directories through BIN_DIR/report, when it is built and no
// signal stopped the sweep; its output goes to DIR/report.log. A failed report is only a warning.
void write_report(const SweepSpec& spec, const std::vector<Run>& runs, const std::string& bin_dir);

}  // namespace lm::sweep
