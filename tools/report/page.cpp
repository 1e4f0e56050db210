// Assembling the report page (see page.h): the CSS, the header, the sections and the footer.
#include "tools/report/page.h"

#include <time.h>

#include <ctime>

#include "common/log.h"
#include "tools/report/html.h"
#include "tools/report/mixture.h"
#include "tools/report/tables.h"

namespace lm::report {
namespace {

const char* kCss = R"CSS(
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--bg:#f4f5f7;--card:#fff;--hl:#fff4c2;--hl2:#ffd666}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:18px 28px 6px}
h1{font-size:22px;margin:0 0 2px}
.sub{color:var(--muted);margin:0}
nav{padding:4px 28px 0;font-size:13px}
nav a{color:#175cd3;text-decoration:none;margin-right:14px}
.runbar{position:sticky;top:0;z-index:2;background:rgba(244,245,247,.95);padding:6px 28px;border-bottom:1px solid var(--line);display:flex;flex-wrap:wrap;gap:4px 16px;font-size:13px}
section{margin:14px 28px;background:var(--card);border:1px solid var(--line);border-radius:8px;padding:14px 18px}
h2{font-size:16px;margin:0 0 10px}
.charts{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:22px 26px}
figure.chart{margin:0;min-width:0}
figcaption{font-weight:600;margin:0 0 2px 4px}
svg.chart{width:100%;height:auto;display:block}
svg.chart text{font-size:11px;fill:#475467}
svg.chart .axis-title{font-size:12px;fill:#344054}
svg.chart .plot{fill:#fcfcfd}
svg.chart .frame{fill:none;stroke:#c4c9d2}
svg.chart .grid line{stroke:#eaecf0}
svg.chart polyline{fill:none;stroke-linejoin:round;stroke-linecap:round}
svg.chart .series{stroke-width:1.7}
svg.chart .raw{stroke-width:1;opacity:.28}
svg.chart .hover rect{fill:transparent}
svg.chart .hover rect:hover{fill:rgba(16,24,40,.07)}
svg.chart .ev-resume{stroke-dasharray:4 3;stroke-width:1.3;opacity:.85}
svg.chart .ev-anomaly{fill:#d92d20}
.legend{display:flex;flex-wrap:wrap;gap:2px 14px;font-size:12px;color:#344054;margin:2px 0 0 72px}
.legend .style{color:var(--muted)}
.legend .nodata{color:var(--muted);font-style:italic}
.sw{display:inline-block;width:22px;height:0;vertical-align:middle;margin-right:5px}
.skipped{color:var(--muted);margin:14px 0 0;padding-left:18px}
table{border-collapse:collapse;font-size:13px}
th,td{padding:3px 9px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
thead th{background:#f9fafb;font-weight:600;border-bottom:1px solid #d0d5dd}
table.runs{font-size:12.5px}
table.runs th,table.runs td{padding:3px 7px}
table.runs thead th{white-space:nowrap}
table.runs thead th.cfg{white-space:normal;min-width:70px}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
.warn{color:#b42318;font-weight:600}
td.name{white-space:nowrap;font-weight:600}
th.cfg,td.cfg{background:#f5f8ff}
.dim{color:var(--muted);font-weight:400}
.scroll{overflow-x:auto}
.notes{margin:10px 0 0;padding-left:18px;color:#93370d}
.wrap{overflow-wrap:anywhere}
.kvgrid{display:grid;gap:14px 18px;align-items:start}
table.kv{width:100%;table-layout:fixed}
table.kv th:first-child{width:38%}
table.kv.multi th:first-child{width:210px}
table.kv td,table.kv tbody th{overflow-wrap:anywhere;font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
table.kv tbody th{font-weight:400;color:#344054}
table.kv thead th:first-child{text-transform:uppercase;letter-spacing:.04em;font-size:12px;color:#475467}
tr.diff td,tr.diff th{background:var(--hl)}
tr.diff td.chg{background:var(--hl2);font-weight:600}
.only-diff:checked~.kvgrid tr.same,.only-diff:checked~.kvgrid table.all-same{display:none}
label{font-size:13px;color:#344054;margin-left:4px}
.only-diff{margin:0 0 10px}
footer{color:var(--muted);font-size:12px;padding:4px 28px 24px}
)CSS";

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

// The given title, else "Run report: " and the first four run names.
std::string page_title(const std::vector<Run>& runs, const std::string& title) {
  if (!title.empty()) return title;
  std::string t = "Run report: ";
  for (size_t i = 0; i < runs.size() && i < 4; ++i) t += (i ? ", " : "") + runs[i].name;
  if (runs.size() > 4) t += strf(" + %zu more", runs.size() - 4);
  return t;
}

// <head>, the page header, the navigation and (several runs) the sticky bar of run colours.
std::string page_top(const std::vector<Run>& runs, const std::string& title) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
                  "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
                  esc(title) + "</title>\n<style>" + kCss + "</style></head>\n<body>\n";
  h += "<header><h1>" + esc(title) + "</h1><p class=\"sub\">" + std::to_string(runs.size()) +
       (runs.size() == 1 ? " run (" + esc(runs[0].dir) + ")" : " runs") + " \xC2\xB7 generated " + now_utc() +
       " by build/bin/report</p></header>\n";
  h += "<nav><a href=\"#runs\">Runs</a><a href=\"#charts\">Charts</a><a href=\"#events\">Events</a>"
       "<a href=\"#config\">Config</a><a href=\"#meta\">Meta</a></nav>\n";
  if (runs.size() > 1) {
    h += "<div class=\"runbar\">";
    for (size_t i = 0; i < runs.size(); ++i) h += "<span>" + swatch(palette(i), 0) + esc(runs[i].name) + "</span>";
    h += "</div>\n";
  }
  return h;
}

// <section id=ID><h2>HEADING</h2> BODY </section>
std::string section(const std::string& id, const std::string& heading, const std::string& body) {
  return "<section id=\"" + id + "\"><h2>" + heading + "</h2>\n" + body + "</section>\n";
}

}  // namespace

std::string render_page(const std::vector<Run>& runs, const PageOptions& o, int* charts_drawn) {
  const std::string title = page_title(runs, o.title);
  std::string h;
  h.reserve(1 << 20);
  h += page_top(runs, title);
  h += section("runs", "Runs", runs_table(runs));
  h += section("charts", "Charts", charts_html(runs, o.charts, charts_drawn));
  if (const std::string mix = mixture_html(runs); !mix.empty()) h += section("mixture", "Data mixture", mix);
  h += section("events", "Events", events_section(runs));
  h += section("config", "Config", kv_section(runs, &Run::config, "config", "config.yaml"));
  h += section("meta", "Meta", kv_section(runs, &Run::meta, "meta", "meta.json"));
  h += "<footer>Hover a chart for exact values; dashed vertical lines mark resumes, red triangles anomalies.";
  if (o.charts.smooth > 0) h += strf(" Train lines smoothed (EMA %.2f) over the faint raw values.", o.charts.smooth);
  h += "</footer>\n</body></html>\n";
  return h;
}

}  // namespace lm::report
