// The report's tables: the runs table (one row per run: status, steps, losses, throughput,
// checkpoints, the config keys that differ; a dist.invariant run marked under its name), the events table (resumes, anomalies) and the config
// and meta tables (runs side by side, differing rows highlighted). Torch-free.
#pragma once

#include <string>
#include <vector>

#include "tools/report/load.h"

namespace lm::report {

// The runs table, then the runs' notes (a <ul class="notes">) when any run has some.
std::string runs_table(const std::vector<Run>& runs);

// The events table (at most 200 rows per run), or a one-line note when there are none.
std::string events_section(const std::vector<Run>& runs);

// Config (field &Run::config) or meta (&Run::meta) as one table per top-level section, runs side by
// side; rows whose values differ between runs have class "diff" (highlighted), the others "same";
// cells that differ from the first run's value have class "chg". With several runs a CSS-only
// checkbox (id ID-only) hides the "same" rows. `what`: the file's name for the notes.
std::string kv_section(const std::vector<Run>& runs, KV Run::*field, const std::string& id, const std::string& what);

}  // namespace lm::report
