// The config schema: one Field per public key, with its parser, its printer, its allowed values
// and its one description. Each section's describe_<section>() beside the struct that owns the
// section fills it (describe_data in data/loader/data_config.cpp, describe_model in
// models/model_config.cpp, ...; the list in run/config/config.cpp's describe()); the config
// loader parses, prints and documents every key from it, and `trainer --keys` prints it. Each helper
// below takes a key's bounds or choices once and derives from them both the check and the
// allowed-values text. Torch-free (lm_common_config), so that data/ and models/ describe their keys.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace lm::config_schema {

struct Field {
  std::string key;
  std::string doc;      // THE description of the key: one line of plain text
  std::string allowed;  // its allowed values as text (">= 1", "[0, 1)", "auto|cpu|cuda", ...)
  // Parses a scalar (or sequence) node into the bound member; throws BadValue on a bad value.
  std::function<void(const YAML::Node&)> set;
  // The current value as YAML text.
  std::function<std::string()> get;
  // JSON type of the value: 'i' integer (-1 = "auto" where allowed), 'n' number, 'b' bool, 's' string,
  // 'y' a structured value (YAML flow text).
  char type = 's';
};

// "a|b|c"; an empty choice is said last as " or empty" ("line|paragraph|jsonl or empty").
std::string choices_text(const std::vector<std::string>& choices);

class Schema {
 public:
  static constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();

  void integer(const std::string& key, int64_t* p, const std::string& doc, int64_t lo, int64_t hi = kNoMax);
  // An integer whose range another component checks (the data.* keys: lm::validate in
  // data/loader/data_config.cpp): parsed here for its type only, [lo, hi] shown as its allowed
  // values (the test Config.KeysShowTheRangesLoadConfigChecks keeps the two in step).
  void integer_checked_later(const std::string& key, int64_t* p, const std::string& doc, int64_t lo,
                             int64_t hi = kNoMax);
  // lo_open: value must be > lo (else >= lo); hi likewise.
  void number(const std::string& key, double* p, const std::string& doc, double lo, bool lo_open,
              double hi = std::numeric_limits<double>::infinity(), bool hi_open = false);
  // An integer >= lo, or the word "auto" (stored as -1).
  void integer_or_auto(const std::string& key, int64_t* p, const std::string& doc, int64_t lo);
  void boolean(const std::string& key, bool* p, const std::string& doc);
  // Free text; `allowed` says what it may be ("path", "auto|none|path"); shown: the value printed
  // (default: *p).
  void text(const std::string& key, std::string* p, const std::string& doc, const std::string& allowed,
            std::function<std::string()> shown = nullptr);
  void choice(const std::string& key, std::string* p, const std::string& doc, std::vector<std::string> allowed);
  // A structured value (a YAML list of maps) parsed by `parse` and printed back as YAML flow text by
  // `print`; an override gives the same as YAML flow text ("data.sources=[{name: a, path: d}]").
  void structured(const std::string& key, const std::string& doc, const std::string& allowed,
                  std::function<void(const YAML::Node&)> parse, std::function<std::string()> print);

  const Field* find(const std::string& key) const;
  const std::vector<Field>& fields() const { return fields_; }
  bool is_section(const std::string& prefix) const;

 private:
  void add(const std::string& key, const std::string& doc, const std::string& allowed,
           std::function<void(const YAML::Node&)> set, std::function<std::string()> get, char type = 's');
  std::vector<Field> fields_;
};

}  // namespace lm::config_schema
