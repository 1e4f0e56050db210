// `report`: one self-contained HTML page from one or more run directories.
//
//   report RUN_DIR [RUN_DIR...] [-o report.html] [--title TEXT] [--max-points N] [--smooth A]
//
// Reads each RUN_DIR's metrics.jsonl (required), config.yaml and meta.json (optional; the run
// directory as the trainer writes it, see docs/runs.md "What a run writes" and run/run_dir.h) and
// writes ONE HTML file with inline CSS and inline SVG. The pieces:
//   load.h    a run directory -> Run (series, events, config, meta, notes)
//   charts.h  the SVG charts (axes, lines, downsampling, smoothing, hover bands, legends)
//   tables.h  the runs, events, config and meta tables
//   page.h    the page: CSS, header, sections, footer
//   html.h    escaping, number formats, units and colours shared by the three above
//
// Exit codes: 0 written; 2 with one line for bad input (no RUN_DIR, not a directory, no
// metrics.jsonl, output not writable). The page is written atomically (temp file, fsync, rename).
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "tools/report/load.h"
#include "tools/report/page.h"

namespace lm::report {
namespace {

struct Options {
  std::vector<std::string> dirs;  // the run directories, in the order shown
  std::string out = "report.html";
  PageOptions page;
};

// Refuses an output path that cannot be written (checked before the runs are read).
void check_output(const std::string& out) {
  if (is_dir(out)) throw UsageError("-o " + out + ": is a directory, expected an HTML file name");
  const auto slash = out.find_last_of('/');
  const std::string parent = slash == std::string::npos ? "." : slash == 0 ? "/" : out.substr(0, slash);
  if (!is_dir(parent)) throw DataError("cannot write " + out + ": no directory " + parent);
  if (::access(parent.c_str(), W_OK) != 0) throw DataError("cannot write " + out + ": directory " + parent + " is not writable");
}

void write_output(const std::string& out, const std::string& html) {
  try {
    files::write_file_atomic(out, html);
  } catch (const Error& e) {
    throw DataError("cannot write " + out + ": " + e.what());
  }
}

// Parses the command line into *o; returns false after --help (printed, nothing to do).
// Throws UsageError for a bad command line.
bool parse_args(int argc, char** argv, Options* o, int* help_exit) {
  ChartOptions& ch = o->page.charts;
  CLI::App app{"report: one self-contained HTML page (inline CSS + SVG charts, config and meta tables) from one or\n"
               "more run directories; several runs are overlaid and their config/meta differences highlighted."};
  app.add_option("RUN_DIR", o->dirs, "Run directories (each with metrics.jsonl; config.yaml and meta.json optional)");
  app.add_option("-o,--out", o->out, "Output HTML file, written atomically")->capture_default_str();
  app.add_option("--title", o->page.title, "Page title (default: the run names)");
  app.add_option("--max-points", ch.max_points, "Most points drawn per line (downsampled keeping the shape)")
      ->capture_default_str();
  app.add_option("--smooth", ch.smooth, "EMA smoothing in [0, 1) of the noisy train lines (loss, throughput, MFU, data wait, grad norm, padding); raw values drawn faint under them")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() != 0) throw UsageError(e.what());
    *help_exit = app.exit(e);  // --help
    return false;
  }
  if (o->dirs.empty()) throw UsageError("no RUN_DIR given (usage: report RUN_DIR [RUN_DIR...] -o report.html)");
  if (o->out.empty()) throw UsageError("-o: empty output path");
  if (ch.max_points < 10) throw UsageError(strf("--max-points %d: must be at least 10", ch.max_points));
  if (!(ch.smooth >= 0 && ch.smooth < 1)) throw UsageError(strf("--smooth %g: must be in [0, 1)", ch.smooth));
  return true;
}

int report_main(int argc, char** argv) {
  Options o;
  int help_exit = kExitOk;
  if (!parse_args(argc, argv, &o, &help_exit)) return help_exit;
  check_output(o.out);
  std::vector<Run> runs;
  for (auto& d : o.dirs) runs.push_back(load_run(d));
  name_runs(runs);
  int charts = 0;
  const std::string html = render_page(runs, o.page, &charts);
  write_output(o.out, html);
  std::printf("report: wrote %s (%zu run%s, %d charts)\n", o.out.c_str(), runs.size(), runs.size() == 1 ? "" : "s", charts);
  return kExitOk;
}

}  // namespace
}  // namespace lm::report

int main(int argc, char** argv) {
  return lm::run_main("report", [&] { return lm::report::report_main(argc, argv); });
}
