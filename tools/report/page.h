// The report page: one self-contained HTML document (inline CSS and SVG; no scripts, fonts,
// images or links out of the page, so it opens offline and can be mailed around). Torch-free.
//
// Sections: a runs table, charts (charts.h), events (resumes, anomalies), the config and the meta
// tables (tables.h). Several runs overlay in one colour each; their config and meta show side by
// side, differing rows highlighted.
#pragma once

#include <string>
#include <vector>

#include "tools/report/charts.h"
#include "tools/report/load.h"

namespace lm::report {

struct PageOptions {
  std::string title;    // page title; "" for "Run report: " and the run names
  ChartOptions charts;  // downsampling and smoothing of the chart lines
};

// The whole page for `runs` (loaded and named, see load.h). *charts_drawn: the number of charts
// with data.
std::string render_page(const std::vector<Run>& runs, const PageOptions& o, int* charts_drawn);

}  // namespace lm::report
