// The report's charts: one inline SVG per metric (loss: train and validation on a log axis;
// learning rate; throughput; MFU; data wait; gradient norm; memory; padding), several runs
// overlaid in one colour each. Torch-free.
//
// Charts are SVG built here: nice 1-2-5 ticks, log axes where values span decades, lines
// downsampled with largest-triangle-three-buckets (shape and spikes kept) to max_points, and hover
// bands whose <title> gives every run's exact value near that step. Every chart shares one step
// axis so that they line up. A chart with no data in any run becomes a one-line note.
#pragma once

#include <string>
#include <vector>

#include "tools/report/load.h"

namespace lm::report {

struct ChartOptions {
  int max_points = 800;  // most points drawn per line (downsampled keeping the shape); >= 10
  double smooth = 0;     // EMA weight in [0, 1) for the noisy train lines, raw values drawn faint
                         // under them; 0: no smoothing
};

// The body of the charts section: <div class="charts"> with one <figure> (inline <svg
// data-chart=ID>) per chart that has data, then <ul class="skipped"> with a note per chart that
// has none. *charts_drawn: the number of figures.
std::string charts_html(const std::vector<Run>& runs, const ChartOptions& o, int* charts_drawn);

}  // namespace lm::report
