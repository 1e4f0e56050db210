// Text and HTML helpers of the report (see html.h).
#include "tools/report/html.h"

#include <cmath>

#include "common/log.h"
#include "run/records.h"

namespace lm::report {
namespace {

const char* kPalette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                          "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939"};
constexpr size_t kPaletteSize = sizeof(kPalette) / sizeof(kPalette[0]);

}  // namespace

std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&#39;"; break;
      case '\n': o += "&#10;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string num(double v) {
  if (v == std::floor(v) && std::fabs(v) < 1e15) return strf("%.0f", v);
  return strf("%.6g", v);
}

std::string si(double v, int sig) {
  const double a = std::fabs(v);
  const char* suf[] = {"", "k", "M", "G", "T", "P"};
  int i = 0;
  while (a >= std::pow(1000.0, i + 1) && i < 5) ++i;
  return strf("%.*g%s", sig, v / std::pow(1000.0, i), suf[i]);
}

std::string duration(double s) {
  if (s < 120) return strf("%.1f s", s);
  if (s < 7200) return strf("%.1f min", s / 60);
  return strf("%.2f h", s / 3600);
}

std::string unit(const char* field) {
  const records::Field* f = records::find_field(field);
  return f ? f->unit : "";
}

const char* palette(size_t i) { return kPalette[i % kPaletteSize]; }

std::string swatch(const std::string& colour, int style) {
  const char* border = style == 1 ? "dashed" : style == 2 ? "dotted" : "solid";
  return "<span class=\"sw\" style=\"border-top:2px " + std::string(border) + " " + colour + "\"></span>";
}

}  // namespace lm::report
