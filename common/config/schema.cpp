// The config schema's helpers (see schema.h): each key's check and its allowed-values text
// from the same bounds and choices.
#include "common/config/schema.h"

#include <algorithm>
#include <cmath>

#include "common/config/values.h"

namespace lm::config_schema {
namespace {

using namespace config_values;

// An integer range as the user reads it: ">= lo" or "[lo, hi]".
std::string int_range(int64_t lo, int64_t hi) {
  return hi == Schema::kNoMax ? ">= " + std::to_string(lo) : "[" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
}

// A number range as an interval, "(0, inf)", "[0, 1)" (the parser's messages say this).
std::string num_interval(double lo, bool lo_open, double hi, bool hi_open) {
  return std::string(lo_open ? "(" : "[") + fmt_double(lo) + ", " +
         (std::isinf(hi) ? "inf)" : fmt_double(hi) + (hi_open ? ")" : "]"));
}

// The same range as the user reads it: "> 0", ">= 0", "[0, 1)".
std::string num_range(double lo, bool lo_open, double hi, bool hi_open) {
  if (std::isinf(hi)) return (lo_open ? "> " : ">= ") + fmt_double(lo);
  return num_interval(lo, lo_open, hi, hi_open);
}

}  // namespace

std::string choices_text(const std::vector<std::string>& choices) {
  std::string all;
  bool empty = false;
  for (const auto& c : choices) {
    if (c.empty()) {
      empty = true;
      continue;
    }
    all += (all.empty() ? "" : "|") + c;
  }
  return empty ? all + " or empty" : all;
}

void Schema::integer(const std::string& key, int64_t* p, const std::string& doc, int64_t lo, int64_t hi) {
  const std::string range = int_range(lo, hi);
  add(key, doc, range, [=](const YAML::Node& n) {
    int64_t v = parse_int(n);
    if (v < lo || v > hi) bad("must be " + std::string(hi == kNoMax ? "" : "in ") + range + ", got " + std::to_string(v));
    *p = v;
  }, [=] { return std::to_string(*p); }, 'i');
}

void Schema::integer_checked_later(const std::string& key, int64_t* p, const std::string& doc, int64_t lo,
                                   int64_t hi) {
  add(key, doc, int_range(lo, hi), [=](const YAML::Node& n) { *p = parse_int(n); },
      [=] { return std::to_string(*p); }, 'i');
}

void Schema::number(const std::string& key, double* p, const std::string& doc, double lo, bool lo_open,
                    double hi, bool hi_open) {
  add(key, doc, num_range(lo, lo_open, hi, hi_open), [=](const YAML::Node& n) {
    double v = parse_double(n);
    bool ok = (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (!ok) bad("must be in " + num_interval(lo, lo_open, hi, hi_open) + ", got " + fmt_double(v));
    *p = v;
  }, [=] { return fmt_double(*p); }, 'n');
}

void Schema::integer_or_auto(const std::string& key, int64_t* p, const std::string& doc, int64_t lo) {
  const std::string range = int_range(lo, kNoMax) + " or auto";
  add(key, doc, range, [=](const YAML::Node& n) {
    if (n.IsScalar() && n.Scalar() == "auto") {
      *p = -1;
      return;
    }
    int64_t v;
    try {
      v = parse_int(n);
    } catch (const BadValue&) {
      bad("expected an integer or auto, got '" + scalar_of(n) + "'");
    }
    if (v < lo) bad("must be " + range + ", got " + std::to_string(v));
    *p = v;
  }, [=] { return *p == -1 ? std::string("auto") : std::to_string(*p); }, 'i');
}

void Schema::boolean(const std::string& key, bool* p, const std::string& doc) {
  add(key, doc, "true|false", [=](const YAML::Node& n) { *p = parse_bool(n); },
      [=] { return std::string(*p ? "true" : "false"); }, 'b');
}

void Schema::text(const std::string& key, std::string* p, const std::string& doc, const std::string& allowed,
                  std::function<std::string()> shown) {
  add(key, doc, allowed, [=](const YAML::Node& n) { *p = n.IsNull() ? "" : scalar_of(n); },
      [=] { return quote(shown ? shown() : *p); });
}

void Schema::choice(const std::string& key, std::string* p, const std::string& doc, std::vector<std::string> allowed) {
  const std::string all = choices_text(allowed);
  add(key, doc, all, [=](const YAML::Node& n) {
    std::string v = scalar_of(n);
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) bad("must be one of " + all + ", got '" + v + "'");
    *p = v;
  }, [=] { return *p; });
}

void Schema::structured(const std::string& key, const std::string& doc, const std::string& allowed,
                        std::function<void(const YAML::Node&)> parse, std::function<std::string()> print) {
  add(key, doc, allowed, [=](const YAML::Node& n) {
    if (n.IsScalar()) {
      YAML::Node parsed;
      try {
        parsed = YAML::Load(n.Scalar());
      } catch (const YAML::Exception& e) {
        bad("cannot parse '" + n.Scalar() + "': " + e.msg);
      }
      return parse(parsed);
    }
    parse(n);
  }, std::move(print), 'y');
}

const Field* Schema::find(const std::string& key) const {
  for (auto& f : fields_)
    if (f.key == key) return &f;
  return nullptr;
}

bool Schema::is_section(const std::string& prefix) const {
  for (auto& f : fields_)
    if (f.key.rfind(prefix + ".", 0) == 0) return true;
  return false;
}

void Schema::add(const std::string& key, const std::string& doc, const std::string& allowed,
                 std::function<void(const YAML::Node&)> set, std::function<std::string()> get, char type) {
  fields_.push_back({key, doc, allowed, std::move(set), std::move(get), type});
}

}  // namespace lm::config_schema
