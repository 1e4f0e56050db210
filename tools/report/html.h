// Text and HTML helpers shared by the report's charts, tables and page: escaping, number formats,
// metric units, the run colours and their swatches. Torch-free.
#pragma once

#include <cstddef>
#include <string>

namespace lm::report {

// `s` escaped for HTML text and attribute values (& < > " ' and newlines).
std::string esc(const std::string& s);

// Exact-enough value for tables and hover titles: integral values bare, the rest to 6 digits.
std::string num(double v);

// 1234567 -> "1.23M" with `sig` significant digits; for counts like tokens.
std::string si(double v, int sig = 3);

// Seconds as "12.3 s", "4.5 min" or "2.25 h".
std::string duration(double s);

// The unit of metric `field` as run/records.h lists it ("ms", "%", "tokens/s"); ""
// when dimensionless or not a known field.
std::string unit(const char* field);

// The colour of run i (or of series i in a one-run chart): a 12-colour palette, repeating.
const char* palette(size_t i);

// A short line in `colour` as legends and run names show it; style 0 solid, 1 dashed, 2 dotted.
std::string swatch(const std::string& colour, int style);

}  // namespace lm::report
