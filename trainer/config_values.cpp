// The config loader's value parsers and printers (see config_values.h).
#include "trainer/config_values.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "common/text.h"

namespace lm::config_values {
namespace {


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

}  // namespace


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

void parse_sources(const YAML::Node& n, std::vector<SourceConfig>* out) {
  out->clear();
  const YAML::Node& list = list_of(n);
  std::vector<std::string> keys;
  for (const auto& f : source_fields()) keys.push_back(f.key);
  for (size_t i = 0; i < list.size(); ++i) {
    SourceConfig s;
    each_key(i, list[i], keys, [&](const std::string& k, const YAML::Node& v) {
      const SourceField& f = *std::find_if(source_fields().begin(), source_fields().end(),
                                           [&](const SourceField& x) { return k == x.key; });
      if (f.text) s.*f.text = scalar_of(v);
      if (f.number) s.*f.number = parse_double(v);
      if (f.integer) s.*f.integer = parse_int(v);
    });
    for (const auto& f : source_fields())
      if (f.required && f.text && (s.*f.text).empty()) bad(entry_where(i, list[i]) + ": needs a name and a path");
    out->push_back(s);
  }
}

void parse_stages(const YAML::Node& n, std::vector<StageConfig>* out) {
  out->clear();
  const YAML::Node& list = list_of(n);
  for (size_t i = 0; i < list.size(); ++i) {
    StageConfig s;
    each_key(i, list[i], {"until", "until_tokens", "weights", "anneal"}, [&](const std::string& k, const YAML::Node& v) {
      if (k == "until") s.until_step = parse_int(v);
      if (k == "until_tokens") s.until_tokens = parse_int(v);
      if (k == "anneal") s.anneal = parse_bool(v);
      if (k != "weights") return;
      if (!v.IsMap()) bad("expected a map of source name: weight");
      for (auto it = v.begin(); it != v.end(); ++it) s.weights.emplace_back(it->first.as<std::string>(), parse_double(it->second));
    });
    out->push_back(s);
  }
}

std::string print_sources(const std::vector<SourceConfig>& v) {
  std::string out;
  for (const auto& s : v) {
    std::string one;
    for (const auto& f : source_fields()) {
      if (f.raw_only && s.text.empty()) continue;
      const std::string value = f.text ? quote(s.*f.text) : f.number ? fmt_double(s.*f.number) : std::to_string(s.*f.integer);
      one += (one.empty() ? "" : ", ") + std::string(f.key) + ": " + value;
    }
    out += (out.empty() ? "{" : ", {") + one + "}";
  }
  return "[" + out + "]";
}

// "[{name, path, ...}]: name: ...; path: ...": data.sources' documentation, from the same table.
std::string sources_doc() {
  std::string keys, docs;
  for (const auto& f : source_fields()) {
    keys += (keys.empty() ? "" : ", ") + std::string(f.key);
    docs += std::string("; ") + f.key + ": " + f.doc;
  }
  return "a mixture instead of data.train: [{" + keys + "}]" + docs;
}

std::string print_stages(const std::vector<StageConfig>& v) {
  std::string out;
  for (const auto& s : v) {
    std::string w;
    for (const auto& [name, x] : s.weights) w += (w.empty() ? "" : ", ") + quote(name) + ": " + fmt_double(x);
    out += (out.empty() ? "" : ", ") + std::string("{") +
           (s.until_tokens > 0 ? "until_tokens: " + std::to_string(s.until_tokens) : "until: " + std::to_string(s.until_step)) +
           ", weights: {" + w + "}" + (s.anneal ? ", anneal: true" : "") + "}";
  }
  return "[" + out + "]";
}

void parse_tasks(const YAML::Node& n, std::vector<TaskConfig>* out) {
  out->clear();
  const YAML::Node& list = list_of(n);
  for (size_t i = 0; i < list.size(); ++i) {
    TaskConfig t;
    each_key(i, list[i], {"name", "path", "kind"}, [&](const std::string& k, const YAML::Node& v) {
      if (k == "name") t.name = scalar_of(v);
      if (k == "path") t.path = scalar_of(v);
      if (k == "kind") t.kind = scalar_of(v);
    });
    const std::string where = entry_where(i, list[i]);
    if (t.name.empty() || t.path.empty()) bad(where + ": needs a name and a path");
    if (t.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != std::string::npos)
      bad(where + ": name '" + t.name + "': letters, digits, '_', '.' and '-' only (it names metrics)");
    if (t.kind != "multiple_choice") bad(where + ": kind '" + t.kind + "': the one kind is multiple_choice");
    for (const auto& o : *out)
      if (o.name == t.name) bad(where + ": a second task named '" + t.name + "'");
    out->push_back(t);
  }
}

std::string print_tasks(const std::vector<TaskConfig>& v) {
  std::string out;
  for (const auto& t : v)
    out += (out.empty() ? "{" : ", {") + std::string("name: ") + quote(t.name) + ", path: " + quote(t.path) +
           ", kind: " + quote(t.kind) + "}";
  return "[" + out + "]";
}

}  // namespace lm::config_values
