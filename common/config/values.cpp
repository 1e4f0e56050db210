// The config schema's value parsers and printers (see values.h).
#include "common/config/values.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "common/text.h"

namespace lm::config_values {

// "entry N (line L)" of a list item, for messages.
std::string entry_where(size_t i, const YAML::Node& n) {
  const int line = n.Mark().line;
  return "entry " + std::to_string(i + 1) + (line >= 0 ? " (line " + std::to_string(line + 1) + ")" : "");
}

// Calls on(key, value) for each key of list item i (a map), naming the item on a bad shape.
void each_key(size_t i, const YAML::Node& item, const std::vector<std::string>& keys,
              const std::function<void(const std::string&, const YAML::Node&)>& on) {
  if (!item.IsMap()) bad(entry_where(i, item) + ": expected a map");
  for (auto it = item.begin(); it != item.end(); ++it) {
    const std::string k = it->first.as<std::string>();
    if (std::find(keys.begin(), keys.end(), k) == keys.end()) {
      std::string all;
      for (const auto& a : keys) all += (all.empty() ? "" : ", ") + a;
      bad(entry_where(i, item) + ": unknown key '" + k + "' (allowed: " + all + ")");
    }
    try {
      on(k, it->second);
    } catch (const BadValue& e) {
      bad(entry_where(i, item) + ": '" + k + "': " + e.what());
    }
  }
}

const YAML::Node& list_of(const YAML::Node& n) {
  if (!n.IsSequence() && !n.IsNull()) bad("expected a list of maps");
  return n;
}

std::string scalar_of(const YAML::Node& n) {
  if (n.IsNull()) bad("missing value");
  if (!n.IsScalar()) bad("expected a single value, got a " + std::string(n.IsMap() ? "map" : "list"));
  if (!valid_utf8(n.Scalar())) bad("not valid UTF-8");  // found by tests/fuzz: JSON records refuse it
  return n.Scalar();
}

int64_t parse_int(const YAML::Node& n) {
  std::string s = scalar_of(n);
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE) {
    // Accept integral floats written as 1e3.
    double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0' && std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15)
      return static_cast<int64_t>(d);
    bad("expected an integer, got '" + s + "'");
  }
  return v;
}

double parse_double(const YAML::Node& n) {
  std::string s = scalar_of(n);
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0' || !std::isfinite(v)) bad("expected a number, got '" + s + "'");
  return v;
}

bool parse_bool(const YAML::Node& n) {
  std::string s = scalar_of(n);
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), ::tolower);
  if (l == "true" || l == "yes" || l == "on" || l == "1") return true;
  if (l == "false" || l == "no" || l == "off" || l == "0") return false;
  bad("expected true or false, got '" + s + "'");
}

std::string fmt_double(double v) {
  std::ostringstream ss;
  ss.precision(17);
  ss << v;
  // Shortest text that reads back as the same double.
  for (int p = 1; p <= 17; ++p) {
    std::ostringstream t;
    t.precision(p);
    t << v;
    if (std::strtod(t.str().c_str(), nullptr) == v) return t.str();
  }
  return ss.str();
}

std::string quote(const std::string& s) {
  YAML::Emitter e;
  e << s;
  return e.c_str();
}

}  // namespace lm::config_values
