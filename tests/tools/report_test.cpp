// Tests of build/bin/report on small synthetic run directories (metrics.jsonl, config.yaml,
// meta.json written here; no trainer): the page is self-contained, has one <svg> per chart with
// data and one line per run and series, a note for a chart without data, config and meta tables
// with the known values, highlighted differences when overlaid, malformed and unknown records
// skipped, the resumed timeline kept, long series downsampled, and bad input refused with exit 2
// and one line.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testutil.h"

namespace lm {
namespace {

namespace fsys = std::filesystem;
using test::read_text;
using test::run_bin;
using test::TempDir;
using test::write_text;

// Every text between `open` and the next `close` in `s`, in order (no <regex>: g++ 12's regex
// headers warn under the sanitizer build's flags, -Wmaybe-uninitialized inside libstdc++).
std::vector<std::string> between(const std::string& s, const std::string& open, const std::string& close) {
  std::vector<std::string> out;
  for (size_t at = s.find(open); at != std::string::npos; at = s.find(open, at)) {
    at += open.size();
    const size_t end = s.find(close, at);
    if (end == std::string::npos) break;
    out.push_back(s.substr(at, end - at));
    at = end + close.size();
  }
  return out;
}

// ---- synthetic runs -------------------------------------------------------------------------

struct FakeRun {
  int steps = 100;          // last train step
  int every = 10;           // train record every N steps
  int val_every = 50;       // 0: no val records
  bool mfu = false;         // mfu_pct numbers (else null, as on CPU)
  double lr = 3e-3;         // optim.lr in config.yaml
  bool meta = true;         // write meta.json
  std::string hostname = "testhost";
  std::string extra;        // appended to metrics.jsonl as is
  nlohmann::ordered_json parallelism;  // meta.json's "parallelism" (null: left out, as older trainers wrote it)
};

double fake_loss(int step) { return 2.0 + 3.5 * std::exp(-step / 40.0); }

std::string train_record(int step, double loss, bool mfu) {
  nlohmann::json j = {{"kind", "train"},          {"step", step},          {"loss", loss},
                      {"lr", 3e-3},               {"grad_norm", 1.0 + 10.0 / step},
                      {"tokens_per_s", 40000.0 + step}, {"tokens_per_s_rank", 40000.0 + step},
                      {"step_ms", 12.5},          {"data_wait_ms", 0.1},   {"data_wait_pct", 0.8},
                      {"tokens", step * 512},     {"epoch", 0},            {"batch_hash", "00000000deadbeef"}};
  j["mfu_pct"] = mfu ? nlohmann::json(31.5) : nlohmann::json(nullptr);
  return j.dump() + "\n";
}

// DIR/NAME with metrics.jsonl, config.yaml and (optionally) meta.json; returns its path.
std::string make_run(const TempDir& t, const std::string& name, const FakeRun& f) {
  const std::string dir = t / name;
  fsys::create_directories(dir);
  std::string m;
  for (int s = f.every; s <= f.steps; s += f.every) {
    m += train_record(s, fake_loss(s), f.mfu);
    if (f.val_every > 0 && s % f.val_every == 0)
      m += nlohmann::json({{"kind", "val"}, {"step", s}, {"val_loss", fake_loss(s) + 0.1}}).dump() + "\n";
  }
  m += nlohmann::json({{"kind", "checkpoint"}, {"step", f.steps}, {"ckpt_block_ms", 7.0}, {"ckpt_write_ms", 6.0},
                       {"ckpt_mb", 1.5}, {"ckpt_mb_per_s", 250.0}})
           .dump() +
       "\n";
  write_text(dir + "/metrics.jsonl", m + f.extra);
  std::ostringstream cfg;
  cfg << "run:\n  dir: " << dir << "\n  seed: 1337\ndata:\n  train: shards/x\n  val: \"\"\nmodel:\n  n_layer: 2\n"
      << "  d_model: 64\noptim:\n  lr: " << f.lr << "\n  weight_decay: 0.1\ntrain:\n  max_steps: " << f.steps << "\n";
  write_text(dir + "/config.yaml", cfg.str());
  if (f.meta) {
    nlohmann::ordered_json meta = {
        {"format", "lmtrain-meta"},
        {"version", 1},
        {"code", {{"commit", "abc123def4567890"}, {"dirty", false}}},
        {"command", "build/bin/trainer configs/tiny.yaml run.dir=" + dir},
        {"config", {{"run", {{"dir", dir}, {"seed", 1337}}}}},
        {"data", {{"dir", "shards/x"}, {"data_version", "0700b2d40e652cf4"}, {"tokenizer", {{"kind", "bytes"}, {"vocab_size", 258}}}}},
        {"host", {{"hostname", f.hostname}, {"cpu_cores", 2}}},
        {"gpu", nullptr},
        {"libtorch", "1.13.0"},
        {"world_size", 1},
        {"model", {{"params", 4240896}, {"flops_per_token", 2.7e7}}},
        {"start_time", "2026-11-30T01:23:45Z"},
        {"end_time", "2026-11-30T01:33:45Z"},
        {"status", "completed"},
        {"exit_code", 0},
        {"attempts", nlohmann::ordered_json::array({{{"start_time", "2026-11-30T01:00:00Z"}, {"status", "failed"}, {"exit_code", 1}}})}};
    if (!f.parallelism.is_null()) meta["parallelism"] = f.parallelism;
    write_text(dir + "/meta.json", meta.dump(1) + "\n");
  }
  return dir;
}

// ---- reading the page -----------------------------------------------------------------------

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + needle.size())) ++n;
  return n;
}

// The <svg ...>...</svg> of chart `id`, or "" when the page has none.
std::string svg_of(const std::string& html, const std::string& id) {
  const size_t at = html.find("<svg class=\"chart\" data-chart=\"" + id + "\"");
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</svg>", at) + 6 - at);
}

// The <figure> holding chart `id` (svg and legend).
std::string figure_of(const std::string& html, const std::string& id) {
  const size_t at = html.find("<figure class=\"chart\" id=\"chart-" + id + "\"");
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</figure>", at) + 9 - at);
}

std::string section_of(const std::string& html, const std::string& id) {
  const size_t at = html.find("<section id=\"" + id + "\"");
  if (at == std::string::npos) return "";
  return html.substr(at, html.find("</section>", at) + 10 - at);
}

// The table row <tr ... data-key="KEY">...</tr> inside `section`, or "".
std::string row_of(const std::string& section, const std::string& key) {
  const size_t k = section.find("data-key=\"" + key + "\"");
  if (k == std::string::npos) return "";
  const size_t at = section.rfind("<tr", k);
  return section.substr(at, section.find("</tr>", k) + 5 - at);
}

// Series polylines of an svg (one per run and series).
size_t series_lines(const std::string& svg) { return count(svg, "<polyline class=\"series\""); }

std::vector<std::pair<double, double>> points_of(const std::string& svg, const std::string& series) {
  std::vector<std::pair<double, double>> out;
  const size_t at = svg.find("data-series=\"" + series + "\"");
  if (at == std::string::npos) return out;
  const size_t p = svg.find("points=\"", at) + 8;
  std::istringstream in(svg.substr(p, svg.find('"', p) - p));
  for (std::string xy; in >> xy;) {
    const auto c = xy.find(',');
    out.emplace_back(std::stod(xy.substr(0, c)), std::stod(xy.substr(c + 1)));
  }
  return out;
}

std::string attr(const std::string& tag_text, const std::string& name) {
  const size_t at = tag_text.find(" " + name + "=\"");
  if (at == std::string::npos) return "";
  const size_t p = at + name.size() + 3;
  return tag_text.substr(p, tag_text.find('"', p) - p);
}

void expect_self_contained(const std::string& page) {
  std::string h = page;
  std::transform(h.begin(), h.end(), h.begin(), [](unsigned char c) { return std::tolower(c); });
  EXPECT_EQ(h.rfind("<!doctype html>", 0), 0u);
  for (const char* bad : {"<script", "<link", "<img", "<iframe", "<object", "<embed", "@import", "url(", "src=",
                          "http:", "https:", "//fonts", "xlink:href"})
    EXPECT_EQ(h.find(bad), std::string::npos) << "page contains " << bad;
  for (const std::string& link : between(h, "href=\"", "\""))
    EXPECT_EQ(link.rfind("#", 0), 0u) << "link out of the page: " << link;
  EXPECT_NE(h.find("</html>"), std::string::npos);
}

// Runs report and returns the page (expects success).
std::string report(const std::vector<std::string>& dirs, const std::string& out, std::vector<std::string> extra = {}) {
  std::vector<std::string> args = dirs;
  args.insert(args.end(), {"-o", out});
  args.insert(args.end(), extra.begin(), extra.end());
  auto r = run_bin("report", args);
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("report: wrote " + out), std::string::npos) << r.out;
  return fsys::exists(out) ? read_text(out) : "";
}

const std::vector<std::string> kAllCharts = {"loss", "lr", "throughput", "mfu", "data_wait", "grad_norm", "memory", "padding"};

// ---- tests ----------------------------------------------------------------------------------

TEST(Report, SingleRunPage) {
  TempDir t;
  const std::string run = make_run(t, "kjv_small", {});
  const std::string h = report({run}, t / "report.html");
  expect_self_contained(h);

  // Charts with data: one <svg> each; MFU (null on CPU), memory and padding skipped with a note.
  for (const char* id : {"loss", "lr", "throughput", "data_wait", "grad_norm"}) {
    EXPECT_EQ(count(h, "data-chart=\"" + std::string(id) + "\" viewBox"), 1u) << id;
    const std::string svg = svg_of(h, id);
    EXPECT_GE(count(svg, "<text"), 6u) << id << ": tick labels and axis titles";
    EXPECT_NE(svg.find(">step</text>"), std::string::npos) << id;
    EXPECT_GT(count(svg, "<title>"), 5u) << id << ": hover titles";
  }
  EXPECT_EQ(count(h, "<svg"), 5u);
  for (const char* id : {"mfu", "memory", "padding"}) {
    EXPECT_EQ(svg_of(h, id), "") << id;
    EXPECT_NE(h.find("<li data-chart=\"" + std::string(id) + "\">"), std::string::npos) << id;
  }
  EXPECT_NE(h.find("mfu_pct unknown"), std::string::npos);

  // Loss: train + validation lines; the others one line.
  const std::string loss = svg_of(h, "loss");
  EXPECT_EQ(series_lines(loss), 2u);
  EXPECT_NE(loss.find("data-series=\"loss\" data-n=\"10\""), std::string::npos);
  EXPECT_NE(loss.find("data-series=\"val_loss\" data-n=\"2\""), std::string::npos);
  EXPECT_EQ(count(loss, "<circle"), 2u);  // a marker per validation point
  EXPECT_EQ(points_of(loss, "loss").size(), 10u);
  for (const char* id : {"lr", "throughput", "data_wait", "grad_norm"}) EXPECT_EQ(series_lines(svg_of(h, id)), 1u) << id;
  // Exact values in hover titles (the last train step and its loss).
  char last[64];
  std::snprintf(last, sizeof last, "%.6g", fake_loss(100));
  EXPECT_NE(loss.find(std::string("train = ") + last), std::string::npos) << last;
  // Loss falls: the first point is higher on the page (smaller y) than the last.
  auto pts = points_of(loss, "loss");
  EXPECT_LT(pts.front().second, pts.back().second);
  EXPECT_LT(pts.front().first, pts.back().first);

  // Config and meta tables with the known values; nothing highlighted for one run.
  const std::string cfg = section_of(h, "config"), meta = section_of(h, "meta");
  EXPECT_NE(row_of(cfg, "model.n_layer").find("<td>2</td>"), std::string::npos) << row_of(cfg, "model.n_layer");
  EXPECT_NE(row_of(cfg, "optim.lr").find("<td>0.003</td>"), std::string::npos) << row_of(cfg, "optim.lr");
  EXPECT_NE(row_of(cfg, "data.val").find("&quot;&quot;"), std::string::npos);
  EXPECT_NE(row_of(meta, "code.commit").find("abc123def4567890"), std::string::npos);
  EXPECT_NE(row_of(meta, "host.hostname").find("testhost"), std::string::npos);
  EXPECT_NE(row_of(meta, "model.params").find("4240896"), std::string::npos);
  EXPECT_EQ(row_of(meta, "config.run.dir"), "");  // meta's copy of the config is the config table
  EXPECT_NE(row_of(meta, "attempts.0.status").find("<td>failed</td>"), std::string::npos);
  EXPECT_NE(section_of(h, "runs").find("1 earlier attempt in this directory"), std::string::npos);
  EXPECT_EQ(count(h, "class=\"diff\""), 0u);
  EXPECT_EQ(h.find("only-diff\" id="), std::string::npos);

  // Runs table: status and wall time from meta.json, steps, final loss.
  const std::string runs = section_of(h, "runs");
  EXPECT_NE(runs.find("kjv_small"), std::string::npos);
  EXPECT_NE(runs.find("completed"), std::string::npos);
  EXPECT_NE(runs.find("100 / 100"), std::string::npos);
  EXPECT_NE(runs.find("10.0 min"), std::string::npos);
}

TEST(Report, OverlayOfThreeRuns) {
  TempDir t;
  FakeRun a, b, c;
  b.lr = 1e-3;
  c.val_every = 0;  // no validation in c
  c.steps = 150;
  c.hostname = "otherhost";
  // b is world-size invariant (meta.json's parallelism); c plain data parallel; a an older meta.json
  // without the key.
  b.parallelism = {{"strategy", "invariant"}, {"world_size", 2}, {"global_micro_batches", 8}, {"micro_batch_size", 4},
                   {"tree_leaves", 8}, {"deal", {{0, 4}, {4, 8}}}, {"combine", "all-gather"}};
  c.parallelism = {{"strategy", "data_parallel"}, {"world_size", 2}};
  const std::vector<std::string> dirs = {make_run(t, "lr3e-3", a), make_run(t, "lr1e-3", b), make_run(t, "noval", c)};
  const std::string h = report(dirs, t / "overlay.html");
  expect_self_contained(h);

  const std::string loss = svg_of(h, "loss");
  EXPECT_EQ(series_lines(loss), 5u);  // train x3, validation x2
  EXPECT_EQ(count(loss, "data-series=\"val_loss\""), 2u);
  for (const char* id : {"lr", "throughput", "data_wait", "grad_norm"}) {
    const std::string svg = svg_of(h, id);
    EXPECT_EQ(series_lines(svg), 3u) << id;
    std::set<std::string> colours;
    for (int r = 0; r < 3; ++r) {
      const size_t at = svg.find("data-run=\"" + std::to_string(r) + "\"");
      ASSERT_NE(at, std::string::npos) << id << " run " << r;
      colours.insert(attr(svg.substr(svg.rfind("<polyline", at), 400), "stroke"));
    }
    EXPECT_EQ(colours.size(), 3u) << id << ": one colour per run";
    const std::string fig = figure_of(h, id);
    for (const char* name : {"lr3e-3", "lr1e-3", "noval"}) EXPECT_NE(fig.find(name), std::string::npos) << id << " legend";
  }
  // The x axis spans the longest run (its last value is in a hover title), the same in every chart.
  EXPECT_NE(svg_of(h, "lr").find("noval = 0.003 @ 150"), std::string::npos);
  auto x_ticks = [](const std::string& chart) {
    const size_t g = chart.find("<g class=\"ticks\">");
    const std::string svg = chart.substr(g, chart.find("</g>", g) - g);
    return between(svg, "text-anchor=\"middle\">", "</text>");
  };
  EXPECT_GE(x_ticks(svg_of(h, "loss")).size(), 4u);
  for (const char* id : {"lr", "throughput", "data_wait", "grad_norm"})
    EXPECT_EQ(x_ticks(svg_of(h, id)), x_ticks(svg_of(h, "loss"))) << id;

  // Config side by side: optim.lr and train.max_steps differ (highlighted, the changed cells marked),
  // model.n_layer does not.
  const std::string cfg = section_of(h, "config");
  const std::string lr_row = row_of(cfg, "optim.lr");
  EXPECT_EQ(lr_row.rfind("<tr class=\"diff\"", 0), 0u) << lr_row;
  EXPECT_NE(lr_row.find("<td>0.003</td><td class=\"chg\">0.001</td><td>0.003</td>"), std::string::npos) << lr_row;
  EXPECT_EQ(row_of(cfg, "train.max_steps").rfind("<tr class=\"diff\"", 0), 0u);
  EXPECT_EQ(row_of(cfg, "model.n_layer").rfind("<tr class=\"same\"", 0), 0u);
  EXPECT_NE(row_of(cfg, "model.n_layer").find("<td>2</td><td>2</td><td>2</td>"), std::string::npos);
  EXPECT_NE(cfg.find("class=\"only-diff\""), std::string::npos);
  // Meta: the host differs, the commit does not.
  const std::string meta = section_of(h, "meta");
  EXPECT_EQ(row_of(meta, "host.hostname").rfind("<tr class=\"diff\"", 0), 0u);
  EXPECT_NE(row_of(meta, "host.hostname").find("<td class=\"chg\">otherhost</td>"), std::string::npos);
  EXPECT_EQ(row_of(meta, "code.commit").rfind("<tr class=\"same\"", 0), 0u);
  // The runs table shows the differing config keys as columns (run.dir left out).
  const std::string runs = section_of(h, "runs");
  EXPECT_NE(runs.find("<th class=\"cfg\">optim.<wbr>lr</th>"), std::string::npos);
  EXPECT_EQ(runs.find("<th class=\"cfg\">run.<wbr>dir</th>"), std::string::npos);
  // The invariant run is marked under its name, its ranks' blocks in the title; the others (another
  // strategy, a meta.json without "parallelism") are not. Checked to fail with the mark left out of
  // run_row.
  const auto rows = between(runs, "<tr><td class=\"name\"", "</tr>");
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_NE(rows[1].find(">world-size invariant: 8 micro-batches in one tree</span>"), std::string::npos) << rows[1];
  EXPECT_NE(rows[1].find("title=\"rank 0 holds [0, 4); rank 1 holds [4, 8)\""), std::string::npos) << rows[1];
  EXPECT_EQ(rows[0].find("invariant"), std::string::npos) << rows[0];
  EXPECT_EQ(rows[2].find("invariant"), std::string::npos) << rows[2];
  EXPECT_EQ(count(h, "world-size invariant"), 1u);
  EXPECT_NE(row_of(meta, "parallelism.strategy").find("<td class=\"chg\">invariant</td>"), std::string::npos)
      << row_of(meta, "parallelism.strategy");
}

TEST(Report, RunWithoutMetaDiffersInNothing) {
  TempDir t;
  FakeRun with, without;
  without.meta = false;
  const std::string h = report({make_run(t, "with", with), make_run(t, "without", without)}, t / "r.html");
  const std::string meta = section_of(h, "meta");
  EXPECT_NE(meta.find("(no meta.json)"), std::string::npos);
  EXPECT_EQ(count(meta, "<tr class=\"diff\""), 0u);
  EXPECT_EQ(row_of(meta, "code.commit").rfind("<tr class=\"same\"", 0), 0u);
  EXPECT_NE(row_of(meta, "model.flops_per_token").find("<td>27000000</td>"), std::string::npos);
  // The config (both have one): only run.dir differs.
  const std::string cfg = section_of(h, "config");
  EXPECT_EQ(count(cfg, "<tr class=\"diff\""), 1u);
  EXPECT_EQ(row_of(cfg, "run.dir").rfind("<tr class=\"diff\"", 0), 0u);
}

TEST(Report, OneRunInOverlayRendersLikeOne) {
  // The same checks as N=1 against N=2, for the line count rule: lines = runs x series with data.
  TempDir t;
  FakeRun f;
  f.mfu = true;
  const std::string one = report({make_run(t, "a", f)}, t / "one.html");
  const std::string two = report({t / "a", make_run(t, "b", f)}, t / "two.html");
  for (const char* id : {"lr", "throughput", "mfu", "data_wait", "grad_norm"}) {
    EXPECT_EQ(series_lines(svg_of(one, id)), 1u) << id;
    EXPECT_EQ(series_lines(svg_of(two, id)), 2u) << id;
  }
  EXPECT_EQ(series_lines(svg_of(one, "loss")), 2u);
  EXPECT_EQ(series_lines(svg_of(two, "loss")), 4u);
  // MFU known: the chart is drawn and the runs table shows the median.
  EXPECT_NE(section_of(one, "runs").find(">31.5<"), std::string::npos);
  EXPECT_EQ(one.find("mfu_pct unknown"), std::string::npos);
}

TEST(Report, RunWithoutValidationRenders) {
  TempDir t;
  FakeRun f;
  f.val_every = 0;
  f.meta = false;
  const std::string h = report({make_run(t, "noval", f)}, t / "r.html");
  expect_self_contained(h);
  const std::string loss = svg_of(h, "loss");
  EXPECT_EQ(series_lines(loss), 1u);
  EXPECT_EQ(loss.find("val_loss"), std::string::npos);
  EXPECT_EQ(count(loss, "<circle"), 0u);
  // Without meta.json: a note, and the meta section says so.
  EXPECT_NE(section_of(h, "runs").find("no meta.json"), std::string::npos);
  EXPECT_NE(section_of(h, "meta").find("No meta.json"), std::string::npos);
  EXPECT_NE(section_of(h, "config").find("data-key=\"optim.lr\""), std::string::npos);
}

TEST(Report, MalformedAndUnknownRecordsAreSkipped) {
  TempDir t;
  FakeRun f;
  f.extra = "not json at all\n"
            "[1, 2, 3]\n"
            "{\"kind\":\"hourly\",\"step\":100,\"tokens\":5}\n"
            "{\"kind\":\"train\",\"lr\":0.001}\n"  // no step
            "{\"kind\":\"train\",\"step\":110,\"lr\":0.002,\"loss\":null}\n"
            "\n"
            "{\"kind\":\"train\",\"step\":120,\"loss\":2.1,\"lr\":0.0";  // cut by a crash
  const std::string h = report({make_run(t, "cut", f)}, t / "r.html");
  expect_self_contained(h);
  EXPECT_NE(h.find("3 malformed lines in metrics.jsonl skipped"), std::string::npos);
  EXPECT_NE(h.find("hourly \xC3\x97" "1"), std::string::npos);
  EXPECT_NE(h.find("train without step"), std::string::npos);
  // Loss: the 10 good records (the null loss at 110 skipped); lr: 11 (110 has one).
  EXPECT_NE(svg_of(h, "loss").find("data-series=\"loss\" data-n=\"10\""), std::string::npos);
  EXPECT_NE(svg_of(h, "lr").find("data-series=\"lr\" data-n=\"11\""), std::string::npos);
}

TEST(Report, ResumeKeepsTheLatestTimeline) {
  TempDir t;
  FakeRun f;
  f.val_every = 0;
  f.extra.clear();
  const std::string dir = make_run(t, "resumed", f);  // train 10..100
  std::string m = read_text(dir + "/metrics.jsonl");
  // Killed after step 100; resumed from the step-60 checkpoint: steps 61.. logged again (+1 loss).
  m += nlohmann::json({{"kind", "resume"}, {"step", 61}, {"checkpoint", "ckpt/step_00000060"}, {"recovery_ms", 900.0},
                       {"load_ms", 12.0}})
           .dump() +
       "\n";
  for (int s = 70; s <= 150; s += 10) m += train_record(s, fake_loss(s) + 1, false);
  m += nlohmann::json({{"kind", "anomaly"}, {"step", 130}, {"time", 1.7e9}, {"reason", "loss spike"}, {"zscore", 6.5}}).dump() + "\n";
  write_text(dir + "/metrics.jsonl", m);
  const std::string h = report({dir}, t / "r.html");
  const std::string loss = svg_of(h, "loss");
  EXPECT_NE(loss.find("data-series=\"loss\" data-n=\"15\""), std::string::npos);  // 10..60, then 70..150
  auto pts = points_of(loss, "loss");
  ASSERT_EQ(pts.size(), 15u);
  for (size_t i = 1; i < pts.size(); ++i) EXPECT_GT(pts[i].first, pts[i - 1].first) << "x must increase";
  EXPECT_EQ(count(loss, "class=\"ev-resume\""), 1u);
  EXPECT_EQ(count(loss, "class=\"ev-anomaly\""), 1u);
  const std::string ev = section_of(h, "events");
  EXPECT_NE(ev.find("resumed from ckpt/step_00000060 (recovery 900 ms, load 12 ms)"), std::string::npos) << ev;
  EXPECT_NE(ev.find("loss spike (zscore=6.5)"), std::string::npos) << ev;
}

TEST(Report, LongSeriesAreDownsampledKeepingSpikes) {
  TempDir t;
  FakeRun f;
  f.steps = 20000;
  f.every = 1;
  f.val_every = 1000;
  const std::string dir = make_run(t, "long", f);
  // A spike at step 12345: the highest loss of the run.
  std::string m = read_text(dir + "/metrics.jsonl");
  const size_t p = m.find("\"step\":12345,");
  ASSERT_NE(p, std::string::npos);
  const size_t b = m.rfind('\n', p) + 1, e = m.find('\n', p) + 1;
  m.replace(b, e - b, train_record(12345, 9.5, false));
  write_text(dir + "/metrics.jsonl", m);

  const std::string h = report({dir}, t / "r.html", {"--max-points", "300"});
  const std::string loss = svg_of(h, "loss");
  EXPECT_NE(loss.find("data-series=\"loss\" data-n=\"20000\""), std::string::npos);
  auto pts = points_of(loss, "loss");
  EXPECT_LE(pts.size(), 300u);
  EXPECT_GE(pts.size(), 250u);
  // The spike survives: the topmost point of the line is near the top of the plot, at x of 12345.
  auto top = *std::min_element(pts.begin(), pts.end(), [](auto& a, auto& b) { return a.second < b.second; });
  EXPECT_LT(top.second, 40.0);
  const auto last = pts.back(), first = pts.front();
  EXPECT_NEAR((top.first - first.first) / (last.first - first.first), 12344.0 / 19999.0, 0.01);
  EXPECT_LT(h.size(), 400u * 1024) << "page size stays small";
}

TEST(Report, DuplicateNamesAndOddCharactersInNames) {
  TempDir t;
  const std::string a = make_run(t, "x/run", {}), b = make_run(t, "y/run", {});
  const std::string odd = make_run(t, "a&b<c>", {});
  const std::string h = report({a, b, odd}, t / "r.html");
  expect_self_contained(h);
  const std::string fig = figure_of(h, "lr");
  EXPECT_NE(fig.find("x/run"), std::string::npos);
  EXPECT_NE(fig.find("y/run"), std::string::npos);
  EXPECT_NE(fig.find("a&amp;b&lt;c&gt;"), std::string::npos);
  EXPECT_EQ(h.find("a&b<c>"), std::string::npos);
}

TEST(Report, OutputIsReplacedAtomically) {
  TempDir t;
  const std::string run = make_run(t, "r", {});
  fsys::create_directories(t / "out");
  write_text(t / "out/report.html", "old");
  report({run}, t / "out/report.html");
  EXPECT_NE(read_text(t / "out/report.html"), "old");
  std::vector<std::string> files;
  for (auto& e : fsys::directory_iterator(t / "out")) files.push_back(e.path().filename().string());
  EXPECT_EQ(files, std::vector<std::string>{"report.html"});  // no temp file left behind
}

TEST(Report, BadInputExitsTwoWithOneLine) {
  TempDir t;
  const std::string run = make_run(t, "ok", {});
  fsys::create_directories(t / "empty_dir");
  write_text(t / "a_file", "x");
  struct Case {
    std::vector<std::string> args;
    std::string expect;  // part of the error line
  };
  const std::vector<Case> cases = {
      {{}, "no RUN_DIR"},
      {{"-o", t / "r.html"}, "no RUN_DIR"},
      {{t / "missing", "-o", t / "r.html"}, "no such run directory"},
      {{t / "a_file", "-o", t / "r.html"}, "no such run directory"},
      {{t / "empty_dir", "-o", t / "r.html"}, "no metrics.jsonl"},
      {{run, t / "empty_dir", "-o", t / "r.html"}, "no metrics.jsonl"},
      {{run, "-o", t / "no/such/dir/r.html"}, "no directory"},
      {{run, "-o", t / "a_file/r.html"}, "no directory"},
      {{run, "-o", t / "empty_dir"}, "is a directory"},
      {{run, "-o", t / "r.html", "--bogus"}, "bogus"},
      {{run, "-o", t / "r.html", "--max-points", "0"}, "--max-points"},
      {{run, "-o", t / "r.html", "--smooth", "1.5"}, "--smooth"},
  };
  for (auto& c : cases) {
    auto r = run_bin("report", c.args);
    std::string out = r.out;
    while (!out.empty() && out.back() == '\n') out.pop_back();
    EXPECT_EQ(r.exit_code, 2) << out;
    EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 0) << "one line: " << out;
    EXPECT_EQ(out.rfind("report: error: ", 0), 0u) << out;
    EXPECT_NE(out.find(c.expect), std::string::npos) << out;
  }
  EXPECT_FALSE(fsys::exists(t / "r.html"));
  // --help is not an error.
  auto h = run_bin("report", {"--help"});
  EXPECT_EQ(h.exit_code, 0);
  EXPECT_NE(h.out.find("RUN_DIR"), std::string::npos);
}

TEST(Report, SmoothingAddsFaintRawLines) {
  TempDir t;
  const std::string h = report({make_run(t, "s", {})}, t / "r.html", {"--smooth", "0.6"});
  const std::string loss = svg_of(h, "loss");
  EXPECT_EQ(series_lines(loss), 2u);  // smoothed train + validation
  EXPECT_EQ(count(loss, "<polyline class=\"raw\""), 1u);
}


// eval.tasks: the "task" records become the downstream chart, acc solid and acc_norm dashed per
// task, at the steps they were scored (the start, step 0, included); a run without them gets the
// chart's note. Checked to fail with the task records left unread in load.cpp (no chart, the note).
TEST(Report, TaskAccuracyCurve) {
  TempDir t;
  FakeRun f;
  for (int s : {0, 50, 100})
    f.extra += nlohmann::json({{"kind", "task"}, {"step", s}, {"task", "cloze"}, {"task_acc", 0.25 + s / 200.0},
                               {"task_acc_norm", 0.3 + s / 400.0}, {"task_examples", 300}, {"task_truncated", 0}})
                   .dump() + "\n";
  const std::string h = report({make_run(t, "tasks", f)}, t / "r.html");
  expect_self_contained(h);
  const std::string svg = svg_of(h, "tasks");
  ASSERT_NE(svg, "") << h.substr(h.find("<ul class=\"skipped\">"), 600);
  EXPECT_EQ(series_lines(svg), 2u);
  EXPECT_NE(svg.find("data-series=\"task_acc/cloze\" data-n=\"3\""), std::string::npos);
  EXPECT_NE(svg.find("data-series=\"task_acc_norm/cloze\" data-n=\"3\""), std::string::npos);
  EXPECT_NE(svg.find("cloze acc = 0.75"), std::string::npos) << "the last acc in a hover title";
  // Accuracy rises: the last point is higher on the page (smaller y) than the first.
  auto pts = points_of(svg, "task_acc/cloze");
  ASSERT_EQ(pts.size(), 3u);
  EXPECT_GT(pts.front().second, pts.back().second);
  EXPECT_NE(figure_of(h, "tasks").find("Downstream tasks"), std::string::npos);
  EXPECT_EQ(h.find("no downstream task scores"), std::string::npos);

  const std::string none = report({make_run(t, "none", {})}, t / "n.html");
  EXPECT_EQ(svg_of(none, "tasks"), "");
  EXPECT_NE(none.find("<li data-chart=\"tasks\">"), std::string::npos);
}

}  // namespace
}  // namespace lm
