// The runs, events, config and meta tables of the report (see tables.h).
#include "tools/report/tables.h"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "common/log.h"
#include "tools/report/html.h"
#include "run/records.h"

namespace lm::report {
namespace {

namespace rec = records;

const char* kEmptyCell = "<span class=\"dim\">\xE2\x80\x94</span>";  // an empty cell

double median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

double mean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double sum = 0;
  for (double x : v) sum += x;
  return sum / v.size();
}

std::vector<double> values(const Run& r, const char* key) {
  std::vector<double> v;
  if (auto it = r.series.find(key); it != r.series.end())
    for (auto& p : it->second) v.push_back(p.value);
  return v;
}

std::string cell_value(const std::string& v) {
  return v.empty() ? "<span class=\"dim\">&quot;&quot;</span>" : esc(v);
}

// "2026-11-30T01:23:45Z" -> seconds since the epoch (-1 when not that form).
double iso_time(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return -1;
  std::tm tm{};
  const std::string s = it->get<std::string>();
  const char* end = ::strptime(s.c_str(), "%Y-%m-%dT%H:%M:%S", &tm);
  if (!end) return -1;
  return static_cast<double>(::timegm(&tm));
}

// Every key of `field` in the runs, in first-seen order.
std::vector<std::string> all_keys(const std::vector<Run>& runs, KV Run::*field) {
  std::vector<std::string> keys;
  std::set<std::string> seen;
  for (auto& r : runs)
    for (auto& [k, v] : r.*field)
      if (seen.insert(k).second) keys.push_back(k);
  return keys;
}

// Keys (in first-seen order) whose values differ between the runs that have the file (a run
// without config.yaml or meta.json differs in nothing), or are missing in some of them.
std::vector<std::string> differing_keys(const std::vector<Run>& runs, KV Run::*field) {
  std::vector<std::string> out;
  for (auto& k : all_keys(runs, field)) {
    std::set<std::string> vals;
    bool missing = false;
    for (auto& r : runs) {
      if ((r.*field).empty()) continue;
      auto* v = kv_find(r.*field, k);
      if (v) vals.insert(*v);
      else missing = true;
    }
    if (vals.size() > 1 || missing) out.push_back(k);
  }
  return out;
}

// ---- runs table -----------------------------------------------------------------------------

// The config keys shown as columns of the runs table: up to 8 that differ between the runs (not
// run.dir). Keys that only some configs have (older trainers) stay in the config table.
std::vector<std::string> diff_columns(const std::vector<Run>& runs) {
  std::vector<std::string> cols;
  if (runs.size() < 2) return cols;
  for (auto& k : differing_keys(runs, &Run::config))
    if (k != "run.dir" && cols.size() < 8 &&
        std::all_of(runs.begin(), runs.end(), [&](const Run& r) { return r.config.empty() || kv_find(r.config, k); }))
      cols.push_back(k);
  return cols;
}

std::string runs_header(const std::vector<std::string>& diff_cols) {
  auto th = [](const std::string& head, const std::string& sub) {
    return "<th>" + head + "<br><span class=\"dim\">" + sub + "</span></th>";
  };
  std::string s = "<div class=\"scroll\"><table class=\"runs\"><thead><tr><th>run</th><th>status</th><th>steps</th><th>tokens</th>" +
                  th("train loss", "last") + th("val loss", "last") + th("val loss", "best @ step") +
                  th(unit(rec::kTokensPerS), "median") + th("MFU " + unit(rec::kMfuPct), "median") +
                  th("data wait", "mean " + unit(rec::kDataWaitPct)) + th("wall", "time") +
                  th("checkpoints", "blocked " + unit(rec::kCkptBlockMs)) + th("resumes", "anomalies");
  for (auto& k : diff_cols) {
    std::string wrapped = esc(k);
    for (size_t p = wrapped.find('.'); p != std::string::npos; p = wrapped.find('.', p + 6)) wrapped.insert(p + 1, "<wbr>");
    s += "<th class=\"cfg\">" + wrapped + "</th>";
  }
  return s + "</tr></thead><tbody>\n";
}

// meta.json's status; else from summary.json (written at the end and on a stop signal) and the
// last step against train.max_steps.
std::string run_status(const Run& r, const Point* lastp, const std::string* max_steps) {
  if (r.has_meta && r.meta_json.contains("status")) return compact(r.meta_json["status"]);
  if (!r.summary_json.is_object()) return "incomplete";
  return lastp && max_steps && num(lastp->step) != *max_steps ? "stopped" : "completed";
}

// The run's wall time in seconds: summary.json's, else meta.json's end_time - start_time; -1.
double wall_seconds(const Run& r) {
  if (r.summary_json.is_object() && r.summary_json.contains(rec::kWallS) && r.summary_json[rec::kWallS].is_number())
    return r.summary_json[rec::kWallS].get<double>();
  if (r.has_meta && iso_time(r.meta_json, "start_time") >= 0 && iso_time(r.meta_json, "end_time") >= 0)
    return iso_time(r.meta_json, "end_time") - iso_time(r.meta_json, "start_time");
  return -1;
}

// Checkpoints saved and their median blocked time; size and write speed in the cell's title.
std::string checkpoint_cell(const Run& r) {
  if (r.ckpt_block_ms.empty()) return "<td class=\"n\">0</td>";
  const std::string speed = r.ckpt_mb_per_s.empty()
                                ? ""
                                : strf(", written at %.0f %s", median(r.ckpt_mb_per_s), unit(rec::kCkptMbPerS).c_str());
  return strf("<td class=\"n\" title=\"%.1f %s each; median: blocked %.1f %s%s\">%zu <span class=\"dim\">\xC2\xB7 %.0f</span></td>",
              r.ckpt_mb, unit(rec::kCkptMb).c_str(), median(r.ckpt_block_ms), unit(rec::kCkptBlockMs).c_str(),
              speed.c_str(), r.ckpt_block_ms.size(), median(r.ckpt_block_ms));
}

// Train loss (last), validation loss (last, best @ step).
std::string loss_cells(const Run& r) {
  std::string loss = kEmptyCell, val = kEmptyCell, best = kEmptyCell;
  if (auto* p = last_point(r, rec::kLoss)) loss = strf("%.4f", p->value);
  if (auto* p = last_point(r, rec::kValLoss)) {
    const Series& vs = r.series.at(rec::kValLoss);
    auto mn = std::min_element(vs.begin(), vs.end(), [](auto& a, auto& b) { return a.value < b.value; });
    val = strf("%.4f", p->value);
    best = strf("%.4f <span class=\"dim\">@ %s</span>", mn->value, num(mn->step).c_str());
  }
  return "<td class=\"n\">" + loss + "</td><td class=\"n\">" + val + "</td><td class=\"n\">" + best + "</td>";
}

// Median throughput and MFU, mean data wait, wall time.
std::string speed_cells(const Run& r) {
  const double tps = median(values(r, rec::kTokensPerS));
  const double mfu = median(values(r, rec::kMfuPct));
  const double wait = mean(values(r, rec::kDataWaitPct));
  const double wall = wall_seconds(r);
  std::string s = "<td class=\"n\">" + (std::isnan(tps) ? std::string(kEmptyCell) : si(tps)) + "</td>";
  s += "<td class=\"n\">" + (std::isnan(mfu) ? std::string(kEmptyCell) : strf("%.1f", mfu)) + "</td>";
  s += "<td class=\"n\">" + (std::isnan(wait) ? std::string(kEmptyCell) : strf("%.2f", wait)) + "</td>";
  s += "<td class=\"n\">" + (wall < 0 ? std::string(kEmptyCell) : duration(wall)) + "</td>";
  return s;
}

// Under the run's name: "world-size invariant: G micro-batches in one tree" when meta.json's
// parallelism.strategy is "invariant" (dist.invariant) or it records "invariant": true (ZeRO-2 and
// 3 under dist.invariant), each rank's block of them in its title; ""
// otherwise (other strategies, and meta.json written before it recorded the parallelism).
std::string invariant_mark(const Run& r) {
  if (!r.has_meta) return "";
  const auto p = r.meta_json.find("parallelism");
  if (p == r.meta_json.end() || !p->is_object()) return "";
  const auto s = p->find("strategy");
  const auto flag = p->find("invariant");  // ZeRO-2 and 3 under dist.invariant: their own strategy, this flag
  const bool strategy = s != p->end() && s->is_string() && s->get<std::string>() == "invariant";
  if (!strategy && !(flag != p->end() && flag->is_boolean() && flag->get<bool>())) return "";
  std::string text = "world-size invariant", title;
  if (const auto g = p->find("global_micro_batches"); g != p->end() && g->is_number_integer())
    text += strf(": %lld micro-batches in one tree", g->get<long long>());
  if (const auto d = p->find("deal"); d != p->end() && d->is_array())
    for (size_t k = 0; k < d->size(); ++k) {
      const json& b = (*d)[k];
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer()) continue;
      title += strf("%srank %zu holds [%lld, %lld)", title.empty() ? "" : "; ", k, b[0].get<long long>(), b[1].get<long long>());
    }
  return "<br><span class=\"dim inv\"" + (title.empty() ? std::string() : " title=\"" + esc(title) + "\"") + ">" +
         esc(text) + "</span>";
}

// Run i's row of the runs table.
std::string run_row(const Run& r, size_t i, const std::vector<std::string>& diff_cols) {
  const Point* lastp = last_point(r, rec::kLoss) ? last_point(r, rec::kLoss) : last_point(r, rec::kLr);
  const std::string* max_steps = kv_find(r.config, "train.max_steps");
  std::string steps = kEmptyCell;
  if (lastp) steps = num(lastp->step);
  if (max_steps && lastp) steps += " / " + esc(*max_steps);
  std::string tokens = kEmptyCell;
  if (auto* p = last_point(r, rec::kTokens)) tokens = si(p->value);
  int resumes = 0, anomalies = 0;
  for (auto& e : r.events) (e.kind == rec::kResume ? resumes : anomalies)++;

  std::string s = "<tr><td class=\"name\" title=\"" + esc(r.dir) + "\">" + swatch(palette(i), 0) + esc(r.name) +
                  invariant_mark(r) + "</td>";
  s += "<td>" + esc(run_status(r, lastp, max_steps)) + "</td><td class=\"n\">" + steps + "</td><td class=\"n\">" + tokens +
       "</td>" + loss_cells(r) + speed_cells(r) + checkpoint_cell(r);
  s += "<td class=\"n\">" + std::to_string(resumes) + " <span class=\"dim\">/</span> " +
       (anomalies ? "<span class=\"warn\">" + std::to_string(anomalies) + "</span>" : std::string("0")) + "</td>";
  for (auto& k : diff_cols) {
    auto* v = kv_find(r.config, k);
    s += "<td class=\"cfg\">" + (v ? cell_value(*v) : std::string(kEmptyCell)) + "</td>";
  }
  return s + "</tr>\n";
}

// ---- config and meta tables -----------------------------------------------------------------

// The table head of one section: the section name, then (several runs) each run's name.
std::string kv_head(const std::vector<Run>& runs, KV Run::*field, const std::string& sec, bool any_diff,
                    const std::string& what) {
  const bool multi = runs.size() > 1;
  std::string s = "<table class=\"kv" + std::string(multi ? " multi" : "") + (any_diff ? " has-diff" : " all-same") +
                  "\" data-section=\"" + esc(sec) + "\"><thead><tr><th>" + esc(sec) + "</th>";
  if (multi)
    for (size_t i = 0; i < runs.size(); ++i)
      s += "<th>" + swatch(palette(i), 0) + esc(runs[i].name) +
           ((runs[i].*field).empty() ? " <span class=\"dim\">(no " + esc(what) + ")</span>" : "") + "</th>";
  else
    s += "<th></th>";
  return s + "</tr></thead><tbody>\n";
}

// The row of `key` (shown as `shown`): each run's value; changed cells are those differing from
// the first run that has the file.
std::string kv_row(const std::vector<Run>& runs, KV Run::*field, const std::string& key, const std::string& shown, bool diff) {
  std::string s = "<tr class=\"" + std::string(diff ? "diff" : "same") + "\" data-key=\"" + esc(key) + "\"><th>" + esc(shown) + "</th>";
  const Run* ref = nullptr;
  for (auto& r : runs)
    if (!ref && !(r.*field).empty()) ref = &r;
  const std::string* first = kv_find(ref->*field, key);
  for (auto& r : runs) {
    const std::string* v = kv_find(r.*field, key);
    const bool chg = diff && !(r.*field).empty() && (!v || !first || *v != *first);
    s += std::string("<td") + (chg ? " class=\"chg\"" : "") + ">" + (v ? cell_value(*v) : kEmptyCell) + "</td>";
  }
  return s + "</tr>\n";
}

}  // namespace

std::string runs_table(const std::vector<Run>& runs) {
  const std::vector<std::string> diff_cols = diff_columns(runs);
  std::string s = runs_header(diff_cols);
  for (size_t i = 0; i < runs.size(); ++i) s += run_row(runs[i], i, diff_cols);
  s += "</tbody></table></div>\n";
  std::string notes;
  for (auto& r : runs)
    for (auto& n : r.notes) notes += "<li>" + (runs.size() > 1 ? "<b>" + esc(r.name) + "</b>: " : std::string()) + esc(n) + "</li>";
  if (!notes.empty()) s += "<ul class=\"notes\">" + notes + "</ul>\n";
  return s;
}

std::string events_section(const std::vector<Run>& runs) {
  std::string rows;
  constexpr size_t kMaxRows = 200;
  for (auto& r : runs) {
    size_t n = 0;
    for (auto& e : r.events) {
      if (++n > kMaxRows) continue;
      rows += "<tr class=\"" + e.kind + "\"><td>" + esc(r.name) + "</td><td class=\"n\">" + num(e.step) + "</td><td>" +
              esc(e.kind) + "</td><td class=\"wrap\">" + esc(e.text) + "</td></tr>\n";
    }
    if (n > kMaxRows)
      rows += "<tr><td>" + esc(r.name) + "</td><td></td><td></td><td class=\"dim\">" + std::to_string(n - kMaxRows) +
              " more not shown</td></tr>\n";
  }
  if (rows.empty()) return "<p class=\"dim\">No resumes or anomalies.</p>\n";
  return "<table class=\"events\"><thead><tr><th>run</th><th>step</th><th>kind</th><th>details</th></tr></thead><tbody>\n" +
         rows + "</tbody></table>\n";
}

std::string kv_section(const std::vector<Run>& runs, KV Run::*field, const std::string& id, const std::string& what) {
  const std::vector<std::string> keys = all_keys(runs, field);
  if (keys.empty()) return "<p class=\"dim\">No " + esc(what) + " in " + (runs.size() > 1 ? "any run" : "this run") + ".</p>\n";
  const std::vector<std::string> diff = differing_keys(runs, field);
  const std::set<std::string> diffs(diff.begin(), diff.end());

  // Sections in first-seen order; keys without a dot form "general".
  std::vector<std::string> order;
  std::map<std::string, std::vector<std::string>> sections;
  for (auto& k : keys) {
    const auto dot = k.find('.');
    const std::string sec = dot == std::string::npos ? "general" : k.substr(0, dot);
    if (!sections.count(sec)) order.push_back(sec);
    sections[sec].push_back(k);
  }
  const bool multi = runs.size() > 1;
  std::string s;
  if (multi)
    s += "<input type=\"checkbox\" class=\"only-diff\" id=\"" + id + "-only\"><label for=\"" + id + "-only\">show only differing keys (" +
         std::to_string(diff.size()) + " of " + std::to_string(keys.size()) + ")</label>\n";
  const int minw = multi ? std::min(1200, 200 + 170 * static_cast<int>(runs.size())) : 340;
  s += strf("<div class=\"kvgrid\" style=\"grid-template-columns:repeat(auto-fill,minmax(%dpx,1fr))\">\n", minw);
  for (auto& sec : order) {
    bool any_diff = false;
    for (auto& k : sections[sec]) any_diff |= diffs.count(k) > 0;
    s += kv_head(runs, field, sec, any_diff, what);
    for (auto& k : sections[sec])
      s += kv_row(runs, field, k, sec == "general" ? k : k.substr(sec.size() + 1), diffs.count(k) > 0);
    s += "</tbody></table>\n";
  }
  return s + "</div>\n";
}

}  // namespace lm::report
