// The SVG charts of the report (see charts.h): axes and tick labels, the chart specs, and one
// chart as frame, event marks, lines, hover bands and legend.
#include "tools/report/charts.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "common/log.h"
#include "tools/report/html.h"
#include "run/records.h"

namespace lm::report {
namespace {

namespace rec = records;

// ---- axes -----------------------------------------------------------------------------------

struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  double step = 0;  // tick spacing in value units for linear ticks, 0 for log decade ticks
  std::vector<double> ticks;
  double frac(double v) const {  // 0 at lo, 1 at hi
    return log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo)) : (v - lo) / (hi - lo);
  }
  double value(double f) const {
    return log ? std::pow(10.0, std::log10(lo) + f * (std::log10(hi) - std::log10(lo))) : lo + f * (hi - lo);
  }
};

double nice_step(double raw) {
  if (!(raw > 0)) return 1;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double r = raw / mag;
  return (r < 1.5 ? 1 : r < 3 ? 2 : r < 7 ? 5 : 10) * mag;
}

// Ticks at multiples of a 1-2-5 step; the axis ends on ticks.
Axis linear_axis(double lo, double hi, int target, double min_step = 0) {
  if (hi <= lo) {
    const double d = lo == 0 ? 1 : std::fabs(lo) * 0.5;
    lo -= lo == 0 ? 0 : d, hi += d;
  }
  Axis a;
  a.step = std::max(min_step, nice_step((hi - lo) / target));
  const double i0 = std::floor(lo / a.step + 1e-9), i1 = std::ceil(hi / a.step - 1e-9);
  a.lo = i0 * a.step, a.hi = std::max(i1, i0 + 1) * a.step;
  for (double i = i0; i <= std::max(i1, i0 + 1) + 1e-9; i += 1) a.ticks.push_back(i == 0 ? 0.0 : i * a.step);
  return a;
}

// Log ticks inside less than a decade: round mantissas, the roundest first (1 2 5, then 3 4 6 8,
// then 1.5 2.5 7 9), each kept when at least a tenth of the axis from those kept: 3 4 5 6 8 10
// over 2.7..11. Over a narrower range, 1-2-5 multiples as on a linear axis.
void narrow_log_ticks(Axis& a, int k0, int k1) {
  auto inside = [&](double v) { return v >= a.lo * (1 - 1e-9) && v <= a.hi * (1 + 1e-9); };
  const double min_ratio = std::pow(10.0, 0.1 * (std::log10(a.hi) - std::log10(a.lo))) * (1 - 1e-9);
  const std::vector<std::vector<double>> levels = {{1, 2, 5}, {3, 4, 6, 8}, {1.5, 2.5, 7, 9}};
  for (auto& level : levels)
    for (int k = k0; k <= k1; ++k)
      for (double m : level) {
        const double v = m * std::pow(10.0, k);
        if (!inside(v)) continue;
        bool far = true;
        for (double t : a.ticks) far &= std::max(v / t, t / v) >= min_ratio;
        if (far) a.ticks.push_back(v);
      }
  std::sort(a.ticks.begin(), a.ticks.end());
  if (a.ticks.size() < 4) {
    a.ticks.clear();
    a.step = nice_step((a.hi - a.lo) / 5);
    for (double i = std::ceil(a.lo / a.step - 1e-9); i * a.step <= a.hi * (1 + 1e-9); i += 1) a.ticks.push_back(i * a.step);
  }
}

// Log axis over [lo, hi] (both > 0), padded a little: decade ticks over wide ranges, 1-2-5 ticks
// over one to three decades, round mantissas inside less than a decade.
Axis log_axis(double lo, double hi) {
  Axis a;
  a.log = true;
  double l0 = std::log10(lo), l1 = std::log10(hi);
  if (l1 - l0 < 1e-6) l0 -= 0.05, l1 += 0.05;
  const double dec = l1 - l0, pad = 0.04 * dec;
  a.lo = std::pow(10.0, l0 - pad), a.hi = std::pow(10.0, l1 + pad);
  auto inside = [&](double v) { return v >= a.lo * (1 - 1e-9) && v <= a.hi * (1 + 1e-9); };
  const int k0 = static_cast<int>(std::floor(l0 - pad)), k1 = static_cast<int>(std::ceil(l1 + pad));
  if (dec >= 3) {
    const int every = static_cast<int>(std::ceil(dec / 6));
    for (int k = k0; k <= k1; ++k)
      if (k % every == 0 && inside(std::pow(10.0, k))) a.ticks.push_back(std::pow(10.0, k));
  } else if (dec >= 1) {
    for (int k = k0; k <= k1; ++k)
      for (double m : {1.0, 2.0, 5.0})
        if (inside(m * std::pow(10.0, k))) a.ticks.push_back(m * std::pow(10.0, k));
  } else {
    narrow_log_ticks(a, k0, k1);
  }
  return a;
}

std::string strip_zeros(std::string s) {  // "2.50" -> "2.5", "3.00" -> "3"
  if (s.find('.') == std::string::npos) return s;
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

std::string sci(double v, int digits) {  // 0.00025 -> "2.5e-4"
  const int e = static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9));
  return strf("%.*fe%d", std::max(0, digits), v / std::pow(10.0, e), e);
}

// Tick label: decimals from the tick step; k/M/G for large values; scientific for tiny ones.
std::string tick_label(double v, const Axis& a) {
  if (v == 0) return "0";
  const double maxabs = std::max(std::fabs(a.lo), std::fabs(a.hi));
  if (a.step == 0) {  // log decade / 1-2-5 ticks
    if (std::fabs(v) >= 1e4) return strip_zeros(si(v, 3));
    if (std::fabs(v) < 1e-3) return strip_zeros(sci(v, 1));
    return strf("%g", v);
  }
  if (maxabs >= 1e4) {
    const double unit = maxabs >= 1e12 ? 1e12 : maxabs >= 1e9 ? 1e9 : maxabs >= 1e6 ? 1e6 : 1e3;
    const char* suf = unit == 1e12 ? "T" : unit == 1e9 ? "G" : unit == 1e6 ? "M" : "k";
    const int d = std::max(0, static_cast<int>(-std::floor(std::log10(a.step / unit) + 1e-9)));
    return strf("%.*f%s", d, v / unit, suf);
  }
  const int d = static_cast<int>(-std::floor(std::log10(a.step) + 1e-9));
  if (d > 4) return sci(v, static_cast<int>(std::floor(std::log10(std::fabs(v)) + 1e-9)) - (-d));
  return strf("%.*f", std::max(0, d), v);
}

// ---- downsampling and smoothing -------------------------------------------------------------

// Largest-triangle-three-buckets: indices of at most `n` points keeping the visual shape (first and
// last point always kept). x increasing.
std::vector<size_t> lttb(const std::vector<double>& x, const std::vector<double>& y, size_t n) {
  const size_t m = x.size();
  std::vector<size_t> out;
  if (n >= m || n < 3) {
    for (size_t i = 0; i < m; ++i) out.push_back(i);
    return out;
  }
  const double every = static_cast<double>(m - 2) / static_cast<double>(n - 2);
  size_t a = 0;
  out.push_back(0);
  for (size_t b = 0; b < n - 2; ++b) {
    const size_t s = static_cast<size_t>(std::floor(b * every)) + 1;
    const size_t e = std::min(m - 1, static_cast<size_t>(std::floor((b + 1) * every)) + 1);
    // Average of the next bucket (the last point for the final bucket).
    const size_t ns = e, ne = std::min(m, static_cast<size_t>(std::floor((b + 2) * every)) + 1);
    double ax = 0, ay = 0;
    for (size_t i = ns; i < std::max(ne, ns + 1) && i < m; ++i) ax += x[i], ay += y[i];
    const double cnt = static_cast<double>(std::max<size_t>(1, std::min(m, std::max(ne, ns + 1)) - ns));
    ax /= cnt, ay /= cnt;
    double best = -1;
    size_t pick = s;
    for (size_t i = s; i < e; ++i) {
      const double area = std::fabs((x[a] - ax) * (y[i] - y[a]) - (x[a] - x[i]) * (ay - y[a]));
      if (area > best) best = area, pick = i;
    }
    out.push_back(pick);
    a = pick;
  }
  out.push_back(m - 1);
  return out;
}

// Debiased exponential moving average (as TensorBoard's smoothing slider).
Series smooth(const Series& s, double alpha) {
  Series o;
  double acc = 0, w = 0;
  for (auto& p : s) {
    acc = alpha * acc + (1 - alpha) * p.value;
    w = alpha * w + (1 - alpha);
    o.push_back({p.step, acc / w});
  }
  return o;
}

// ---- what is charted ------------------------------------------------------------------------

const char* kDashArray[] = {"", "7 4", "2 3"};  // per series style: solid, dashed, dotted

struct SeriesSpec {
  std::string key;    // metric name in Run::series
  std::string label;  // legend text
  int style;          // 0 solid line; 1 dashed + markers; 2 dotted + markers
  bool noisy;         // a measurement smoothed with --smooth (not the schedule or memory)
};
struct ChartSpec {
  const char* id;
  const char* title;
  std::string y_title;
  bool log_y;  // log axis when all values > 0
  bool zero;   // the y axis includes 0 (linear only)
  std::vector<SeriesSpec> series;
  std::string empty_note;
};

// `text` with "{unit}" replaced by the unit of metric `field`.
std::string with_unit(std::string text, const char* field) {
  const auto at = text.find("{unit}");
  return at == std::string::npos ? text : text.replace(at, 6, unit(field));
}

const std::vector<ChartSpec>& chart_specs() {
  static const std::vector<ChartSpec> specs = {
      {"loss", "Loss", with_unit("loss ({unit}, log scale)", rec::kLoss), true, false,
       {{rec::kLoss, "train", 0, true}, {rec::kValLoss, "validation", 1, false},
        {rec::kValLossEma, "validation, EMA weights", 2, false}},
       "no train or validation loss values"},
      {"lr", "Learning rate", "learning rate", false, true, {{rec::kLr, "learning rate", 0, false}},
       "no learning-rate values"},
      {"throughput", "Throughput", with_unit("{unit} (all ranks)", rec::kTokensPerS), false, true,
       {{rec::kTokensPerS, unit(rec::kTokensPerS), 0, true}}, "no throughput values"},
      {"mfu", "MFU", with_unit("model FLOPs utilization ({unit})", rec::kMfuPct), false, true,
       {{rec::kMfuPct, "MFU", 0, true}}, std::string("no MFU values (") + rec::kMfuPct + " unknown, e.g. on CPU)"},
      {"data_wait", "Data wait", with_unit("data wait ({unit} of step time)", rec::kDataWaitPct), false, true,
       {{rec::kDataWaitPct, "data wait", 0, true}}, "no data-wait values"},
      {"grad_norm", "Gradient norm", "gradient norm (log scale)", true, false,
       {{rec::kGradNorm, "gradient norm", 0, true}}, "no gradient-norm values"},
      {"memory", "Memory", with_unit("memory ({unit})", rec::kMemMb), false, true, {{rec::kMemMb, "memory", 0, false}},
       std::string("no memory values (") + rec::kMemMb + ")"},
      {"padding", "Padding", with_unit("padding ({unit} of tokens)", rec::kPaddingPct), false, true,
       {{rec::kPaddingPct, "padding", 0, true}}, "no padding values (only bucketed data has padding)"},
  };
  return specs;
}

// The downstream tasks' chart (eval.tasks): each task's acc (solid) and acc_norm (dashed), over the
// task names any run has; empty series when none has one.
ChartSpec task_chart(const std::vector<Run>& runs) {
  ChartSpec c{"tasks", "Downstream tasks", "accuracy (share of examples)", false, true, {},
              "no downstream task scores (eval.tasks)"};
  std::set<std::string> names;
  const std::string prefix = std::string(rec::kTaskAcc) + "/";
  for (const auto& r : runs)
    for (const auto& [key, s] : r.series)
      if (key.rfind(prefix, 0) == 0) names.insert(key.substr(prefix.size()));
  for (const auto& n : names) {
    c.series.push_back({task_series(rec::kTaskAcc, n), n + " acc", 0, false});
    c.series.push_back({task_series(rec::kTaskAccNorm, n), n + " acc_norm", 1, false});
  }
  return c;
}

// Every chart: the fixed ones, then the tasks'.
std::vector<ChartSpec> all_charts(const std::vector<Run>& runs) {
  std::vector<ChartSpec> v = chart_specs();
  v.push_back(task_chart(runs));
  return v;
}

// ---- one chart ------------------------------------------------------------------------------

// Geometry of every chart (viewBox units; the SVG scales to its column).
constexpr double kW = 660, kH = 330, kML = 72, kMR = 18, kMT = 14, kMB = 50;
constexpr double kPW = kW - kML - kMR, kPH = kH - kMT - kMB;

struct Line {
  int run;
  int spec;  // index into ChartSpec::series
  const Series* s;
};

// One chart being drawn: its spec, the runs, both axes and the lines with data.
struct Plot {
  const ChartSpec& c;
  const std::vector<Run>& runs;
  const Axis& xa;
  Axis ya;
  std::vector<Line> lines;
  std::set<int> drawn_runs;  // runs with at least one line

  double X(double v) const { return kML + xa.frac(v) * kPW; }
  double Y(double v) const { return kMT + (1 - ya.frac(v)) * kPH; }
  // One colour per run when overlaid, per series when one run.
  std::string colour(int run, int spec) const { return palette(runs.size() == 1 ? spec : run); }
};

std::vector<Line> chart_lines(const ChartSpec& c, const std::vector<Run>& runs) {
  std::vector<Line> lines;
  for (size_t r = 0; r < runs.size(); ++r)
    for (size_t k = 0; k < c.series.size(); ++k) {
      auto it = runs[r].series.find(c.series[k].key);
      if (it != runs[r].series.end() && !it->second.empty()) lines.push_back({(int)r, (int)k, &it->second});
    }
  return lines;
}

Axis y_axis(const ChartSpec& c, const std::vector<Line>& lines) {
  double ymin = INFINITY, ymax = -INFINITY;
  for (auto& l : lines)
    for (auto& p : *l.s) ymin = std::min(ymin, p.value), ymax = std::max(ymax, p.value);
  if (c.log_y && ymin > 0) return log_axis(ymin, ymax);
  return linear_axis(c.zero ? std::min(0.0, ymin) : ymin, c.zero ? std::max(0.0, ymax) : ymax, 5);
}

// Grid, tick labels, frame and axis titles.
std::string svg_frame(const Plot& p) {
  std::string s = "<g class=\"grid\">";
  for (double t : p.ya.ticks) s += strf("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", kML, kML + kPW, p.Y(t), p.Y(t));
  for (double t : p.xa.ticks) s += strf("<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\"/>", p.X(t), p.X(t), kMT, kMT + kPH);
  s += "</g>\n<g class=\"ticks\">";
  for (double t : p.ya.ticks)
    s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%s</text>", kML - 7, p.Y(t) + 4, esc(tick_label(t, p.ya)).c_str());
  for (double t : p.xa.ticks)
    s += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>", p.X(t), kMT + kPH + 17,
              esc(tick_label(t, p.xa)).c_str());
  s += "</g>\n";
  s += strf("<rect class=\"frame\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", kML, kMT, kPW, kPH);
  s += strf("<text class=\"axis-title\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", kML + kPW / 2, kH - 10);
  s += strf("<text class=\"axis-title\" transform=\"translate(16 %.1f) rotate(-90)\" text-anchor=\"middle\">%s</text>\n",
            kMT + kPH / 2, esc(p.c.y_title).c_str());
  return s;
}

// Resume lines and anomaly marks of the runs drawn here.
std::string svg_events(const Plot& p) {
  std::string ev;
  for (int r : p.drawn_runs)
    for (auto& e : p.runs[r].events) {
      if (e.step < p.xa.lo || e.step > p.xa.hi) continue;
      const std::string title =
          "<title>" + esc(p.runs[r].name + ": " + e.kind + " at step " + num(e.step) + ": " + e.text) + "</title>";
      if (e.kind == rec::kResume)
        ev += strf("<line class=\"ev-resume\" x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\">", p.X(e.step),
                   p.X(e.step), kMT, kMT + kPH, p.colour(r, 0).c_str()) +
              title + "</line>";
      else
        ev += strf("<path class=\"ev-anomaly\" d=\"M%.1f %.1fl-5 -8h10z\">", p.X(e.step), kMT + kPH) + title + "</path>";
    }
  return ev.empty() ? "" : "<g class=\"events\">" + ev + "</g>\n";
}

// One <polyline> of `pts` (the line's points, or their smoothed values) downsampled to
// max_points; its <title> tells the raw series' size, last and minimum.
std::string svg_polyline(const Plot& p, const Line& l, const Series& pts, const std::string& cls, int max_points) {
  const SeriesSpec& sp = p.c.series[l.spec];
  std::vector<double> px, py;
  px.reserve(pts.size()), py.reserve(pts.size());
  for (auto& q : pts) px.push_back(p.X(q.step)), py.push_back(p.Y(q.value));
  std::string s = strf("<polyline class=\"%s\" data-run=\"%d\" data-series=\"%s\" data-n=\"%zu\" stroke=\"%s\"", cls.c_str(),
                       l.run, sp.key.c_str(), pts.size(), p.colour(l.run, l.spec).c_str());
  if (*kDashArray[sp.style]) s += strf(" stroke-dasharray=\"%s\"", kDashArray[sp.style]);
  s += " points=\"";
  for (size_t i : lttb(px, py, static_cast<size_t>(max_points))) s += strf("%.1f,%.1f ", px[i], py[i]);
  if (s.back() == ' ') s.pop_back();
  const Series& raw = *l.s;
  auto mn = std::min_element(raw.begin(), raw.end(), [](auto& a, auto& b) { return a.value < b.value; });
  s += "\"><title>" +
       esc(p.runs[l.run].name + " \xC2\xB7 " + sp.label + ": " + std::to_string(raw.size()) + " points; last " +
           num(raw.back().value) + " @ step " + num(raw.back().step) + "; min " + num(mn->value) + " @ step " + num(mn->step)) +
       "</title></polyline>\n";
  return s;
}

// Point markers of a sparse line (validation, or a single point), thinned to 150.
std::string svg_markers(const Plot& p, const Line& l) {
  const SeriesSpec& sp = p.c.series[l.spec];
  const std::string col = p.colour(l.run, l.spec);
  std::vector<double> px, py;
  for (auto& q : *l.s) px.push_back(p.X(q.step)), py.push_back(p.Y(q.value));
  std::string s;
  for (size_t i : lttb(px, py, 150))
    s += strf("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>", px[i], py[i], col.c_str()) +
         esc(p.runs[l.run].name + " \xC2\xB7 " + sp.label + " = " + num((*l.s)[i].value) + " @ step " + num((*l.s)[i].step)) +
         "</title></circle>";
  return s;
}

// The lines: one <polyline class="series"> per (run, series), a faint "raw" one under a smoothed
// one. *markers: the markers of the sparse lines, drawn later above the hover bands.
std::string svg_lines(const Plot& p, const ChartOptions& o, std::string* markers) {
  std::string s = "<g class=\"lines\">\n";
  for (auto& l : p.lines) {
    const SeriesSpec& sp = p.c.series[l.spec];
    if (o.smooth > 0 && sp.noisy && l.s->size() > 2) {
      s += svg_polyline(p, l, *l.s, "raw", o.max_points);
      s += svg_polyline(p, l, smooth(*l.s, o.smooth), "series", o.max_points);
    } else {
      s += svg_polyline(p, l, *l.s, "series", o.max_points);
    }
    if (sp.style != 0 || l.s->size() == 1) *markers += svg_markers(p, l);
  }
  return s + "</g>\n";
}

struct Band {
  double s0, s1, at;  // step range [s0, s1) (the last band includes s1), preferred step
};

// Up to 120 distinct steps: one band per step (from halfway to the previous step to halfway to the
// next). Beyond, 120 equal bands, each for the points nearest its middle (the last: its end).
std::vector<Band> hover_bands(const Plot& p) {
  std::vector<Band> bands;
  std::set<double> steps;
  for (auto& l : p.lines) {
    for (auto& q : *l.s) steps.insert(q.step);
    if (steps.size() > 120) break;
  }
  if (steps.size() <= 120) {
    std::vector<double> u(steps.begin(), steps.end());
    for (size_t i = 0; i < u.size(); ++i)
      bands.push_back({i == 0 ? p.xa.lo : (u[i - 1] + u[i]) / 2, i + 1 == u.size() ? p.xa.hi : (u[i] + u[i + 1]) / 2, u[i]});
  } else {
    for (int b = 0; b < 120; ++b) {
      const double s0 = p.xa.value(b / 120.0), s1 = p.xa.value((b + 1) / 120.0);
      bands.push_back({s0, s1, b == 119 ? s1 : (s0 + s1) / 2});
    }
  }
  return bands;
}

// The hover text of one band: "step S" (or "steps A-B") and every line's value nearest band.at;
// "" when no line has a point in the band.
std::string band_text(const Plot& p, const Band& band, bool last_band) {
  const std::vector<Run>& runs = p.runs;
  std::string text;
  double lo_step = INFINITY, hi_step = -INFINITY;
  for (auto& l : p.lines) {
    const Series& ser = *l.s;
    auto it = std::lower_bound(ser.begin(), ser.end(), band.s0, [](const Point& q, double v) { return q.step < v; });
    const Point* best = nullptr;
    for (; it != ser.end() && (it->step < band.s1 || (last_band && it->step <= band.s1)); ++it)
      if (!best || std::fabs(it->step - band.at) < std::fabs(best->step - band.at)) best = &*it;
    if (!best) continue;
    lo_step = std::min(lo_step, best->step), hi_step = std::max(hi_step, best->step);
    const std::string& label = p.c.series[l.spec].label;
    std::string who = runs.size() > 1 ? runs[l.run].name : "";
    if (p.c.series.size() > 1) who += (who.empty() ? "" : " \xC2\xB7 ") + label;
    if (who.empty()) who = label;
    text += "\n" + who + " = " + num(best->value) + (runs.size() > 1 || p.c.series.size() > 1 ? " @ " + num(best->step) : "");
  }
  if (text.empty()) return "";
  return (lo_step == hi_step ? "step " + num(lo_step) : "steps " + num(lo_step) + "\xE2\x80\x93" + num(hi_step)) + text;
}

// Hover bands: transparent rects whose <title> gives every line's exact value near the band.
std::string svg_hover(const Plot& p) {
  const std::vector<Band> bands = hover_bands(p);
  std::string s = "<g class=\"hover\">";
  for (size_t b = 0; b < bands.size(); ++b) {
    const std::string text = band_text(p, bands[b], b + 1 == bands.size());
    if (text.empty()) continue;
    const double x0 = p.X(bands[b].s0), x1 = p.X(bands[b].s1);
    s += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\"><title>", x0, kMT, std::max(0.5, x1 - x0), kPH) +
         esc(text) + "</title></rect>";
  }
  return s + "</g>\n";
}

// Legend (HTML, wraps): runs by colour when overlaid, series by style; runs without data named.
std::string legend_html(const Plot& p) {
  const ChartSpec& c = p.c;
  std::string s = "<div class=\"legend\">";
  std::set<int> specs_drawn;
  for (auto& l : p.lines) specs_drawn.insert(l.spec);
  if (p.runs.size() == 1) {
    for (int k : specs_drawn) s += "<span>" + swatch(p.colour(0, k), c.series[k].style) + esc(c.series[k].label) + "</span>";
  } else {
    for (int r : p.drawn_runs) s += "<span>" + swatch(p.colour(r, 0), 0) + esc(p.runs[r].name) + "</span>";
    if (specs_drawn.size() > 1)
      for (int k : specs_drawn)
        s += "<span class=\"style\">" + swatch("#667085", c.series[k].style) + esc(c.series[k].label) + "</span>";
  }
  std::string missing;
  for (size_t r = 0; r < p.runs.size(); ++r)
    if (!p.drawn_runs.count((int)r)) missing += (missing.empty() ? "" : ", ") + p.runs[r].name;
  if (!missing.empty()) s += "<span class=\"nodata\">no data: " + esc(missing) + "</span>";
  return s + "</div>";
}

// One chart as <figure> with an inline <svg data-chart=ID>, or "" with *note set when no run has
// data for it. `x_axis`: the steps, shared by all charts so that they line up.
std::string render_chart(const ChartSpec& c, const std::vector<Run>& runs, const Axis& x_axis, const ChartOptions& o,
                         std::string* note) {
  std::vector<Line> lines = chart_lines(c, runs);
  if (lines.empty()) {
    *note = c.empty_note;
    return "";
  }
  const Axis y = y_axis(c, lines);
  Plot p{c, runs, x_axis, y, std::move(lines), {}};
  for (auto& l : p.lines) p.drawn_runs.insert(l.run);

  std::string s;
  s.reserve(64 * 1024);
  s += "<figure class=\"chart\" id=\"chart-" + std::string(c.id) + "\"><figcaption>" + esc(c.title) + "</figcaption>\n";
  s += strf("<svg class=\"chart\" data-chart=\"%s\" viewBox=\"0 0 %.0f %.0f\" role=\"img\" aria-label=\"%s\">\n", c.id, kW,
            kH, esc(c.title).c_str());
  s += strf("<rect class=\"plot\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", kML, kMT, kPW, kPH);
  s += svg_frame(p);
  s += svg_events(p);
  std::string markers;
  s += svg_lines(p, o, &markers);
  s += svg_hover(p);
  if (!markers.empty()) s += "<g class=\"markers\">" + markers + "</g>\n";
  s += "</svg>\n";
  s += legend_html(p) + "</figure>\n";
  return s;
}

// One step axis for every chart, over every charted series of every run.
Axis step_axis(const std::vector<Run>& runs) {
  double xmin = INFINITY, xmax = -INFINITY;
  for (auto& c : all_charts(runs))
    for (auto& sp : c.series)
      for (auto& r : runs)
        if (auto it = r.series.find(sp.key); it != r.series.end() && !it->second.empty())
          xmin = std::min(xmin, it->second.front().step), xmax = std::max(xmax, it->second.back().step);
  if (!(xmin <= xmax)) xmin = xmax = 0;
  return linear_axis(xmin > 0.2 * xmax ? xmin : 0, std::max(xmax, 1.0), 6, 1);
}

}  // namespace

std::string charts_html(const std::vector<Run>& runs, const ChartOptions& o, int* charts_drawn) {
  const Axis x_axis = step_axis(runs);
  std::string h = "<div class=\"charts\">\n", skipped;
  *charts_drawn = 0;
  for (auto& c : all_charts(runs)) {
    std::string note;
    std::string fig = render_chart(c, runs, x_axis, o, &note);
    if (fig.empty()) {
      skipped += "<li data-chart=\"" + std::string(c.id) + "\"><b>" + esc(c.title) + "</b>: " + esc(note) + "</li>";
    } else {
      h += fig;
      ++*charts_drawn;
    }
  }
  h += "</div>\n";
  if (!skipped.empty()) h += "<ul class=\"skipped\">" + skipped + "</ul>\n";
  return h;
}

}  // namespace lm::report
