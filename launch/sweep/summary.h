// What the runs of a sweep achieved: numbers read back from each run directory's metrics.jsonl,
// and DIR/summary.csv and DIR/summary.md (written atomically; rows sorted by best validation loss,
// runs without one last, otherwise in sweep order).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "launch/sweep/plan.h"
#include "launch/sweep/spec.h"

namespace lm::sweep {

struct RunStats {
  int64_t steps = -1;          // last train step logged, or the newest checkpoint if later
  double train_loss = NAN;     // its loss
  double best_val = NAN;       // min val_loss
  int64_t best_val_step = -1;
  double tokens_per_s = NAN;   // mean over train records, the first one (warm-up) left out
};

// The stats of a run directory; lines that do not parse (cut by a crash) are left out.
RunStats read_stats(const std::string& run_dir);

// `v` printed with `fmt`, or "" when it is not finite.
std::string num(double v, const char* fmt);

// DIR/summary.csv and DIR/summary.md of the runs (their status from this invocation).
void write_summaries(const SweepSpec& s, const std::vector<Run>& runs);

}  // namespace lm::sweep
