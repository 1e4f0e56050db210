// The data-mixture chart (see mixture.h).
#include "tools/report/mixture.h"

#include <algorithm>
#include <map>

#include "common/log.h"
#include "tools/report/html.h"

namespace lm::report {
namespace {

constexpr double kMixW = 640, kMixH = 200, kMixLeft = 40, kMixTop = 10;

// The target shares (name -> share) in effect at `step`, from meta.json's data.mixture; empty when
// the run has no meta.
std::map<std::string, double> target_at(const Run& r, double step) {
  std::map<std::string, double> w;
  if (!r.meta_json.is_object() || !r.meta_json.contains("data")) return w;
  const json& mix = r.meta_json["data"].value("mixture", json());
  if (!mix.is_object()) return w;
  for (const auto& s : mix["sources"]) w[s["name"].get<std::string>()] = s["weight"].get<double>();
  for (const auto& st : mix["stages"]) {
    const int64_t until = st.value("until", int64_t{0});
    if (st.value("until_tokens", int64_t{0}) > 0) continue;  // a token boundary is not drawn
    for (auto& [name, v] : w) v = st["weights"].value(name, 0.0);
    if (until == 0 || step <= static_cast<double>(until)) break;
  }
  double sum = 0;
  for (auto& [name, v] : w) sum += v;
  for (auto& [name, v] : w) v = sum > 0 ? v / sum : 0;
  return w;
}

std::string run_chart(const Run& r, size_t index) {
  const auto& mix = r.source_tokens;
  const Series& first = mix.begin()->second;
  const double x0 = 0, x1 = std::max(1.0, first.back().step);
  auto X = [&](double step) { return kMixLeft + (kMixW - kMixLeft - 10) * (step - x0) / (x1 - x0); };
  auto Y = [&](double share) { return kMixTop + (kMixH - kMixTop - 20) * (1 - share); };
  std::string svg = strf("<svg viewBox=\"0 0 %.0f %.0f\" width=\"%.0f\" height=\"%.0f\">", kMixW, kMixH, kMixW, kMixH);
  std::vector<double> below(first.size(), 0.0);
  size_t colour = 0;
  std::string legend;
  for (const auto& [name, s] : mix) {
    std::string top, bottom;
    for (size_t i = 0; i < s.size() && i < first.size(); ++i) {
      double total = 0;
      for (const auto& [n2, s2] : mix) total += i < s2.size() ? s2[i].value : 0;
      const double share = total > 0 ? s[i].value / total : 0;
      const double prev = i == 0 ? x0 : s[i - 1].step;
      top += strf("%.1f,%.1f %.1f,%.1f ", X(prev), Y(below[i] + share), X(s[i].step), Y(below[i] + share));
      bottom = strf("%.1f,%.1f %.1f,%.1f ", X(s[i].step), Y(below[i]), X(prev), Y(below[i])) + bottom;
      below[i] += share;
    }
    svg += strf("<polygon points=\"%s%s\" fill=\"%s\" fill-opacity=\"0.55\"><title>%s</title></polygon>", top.c_str(),
                bottom.c_str(), palette(colour), esc(name).c_str());
    legend += swatch(palette(colour++), 0) + " " + esc(name) + " ";
  }
  // Target: the cumulative boundary of each source's target share, dashed.
  std::map<std::string, std::string> lines;
  for (const Point& p : first) {
    double acc = 0;
    for (const auto& [name, share] : target_at(r, p.step)) {
      acc += share;
      lines[name] += strf("%.1f,%.1f ", X(p.step), Y(acc));
    }
  }
  for (const auto& [name, pts] : lines)
    svg += strf("<polyline points=\"%s\" fill=\"none\" stroke=\"#000\" stroke-dasharray=\"4 3\"><title>target: %s"
                "</title></polyline>", pts.c_str(), esc(name).c_str());
  svg += strf("<text x=\"%.0f\" y=\"%.0f\" font-size=\"10\">step %.0f</text></svg>", kMixW - 80, kMixH - 4, x1);
  return strf("<figure data-chart=\"mixture-%zu\"><figcaption>%s: realised token share per window (stacked), "
              "target dashed. %s</figcaption>", index, esc(r.name).c_str(), legend.c_str()) + svg + "</figure>\n";
}

}  // namespace

std::string mixture_html(const std::vector<Run>& runs) {
  std::string h;
  for (size_t i = 0; i < runs.size(); ++i)
    if (!runs[i].source_tokens.empty() && !runs[i].source_tokens.begin()->second.empty()) h += run_chart(runs[i], i);
  return h.empty() ? "" : "<div class=\"charts\">\n" + h + "</div>\n";
}

}  // namespace lm::report
