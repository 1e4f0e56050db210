// The config schema's value parsers and printers (used by common/config/schema.cpp and by the
// describe_<section>() functions of the sections with structured keys): YAML scalars to typed values,
// values back to the shortest YAML text, and the pieces of a list-of-maps key (data.sources,
// data.stages, eval.tasks). Each throws BadValue (the message; the config loader adds where it came
// from). Torch-free.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

namespace lm::config_values {

// A bad value's message; the config loader adds where it came from (the key, FILE:LINE or the
// override) and throws the ConfigError the user sees.
struct BadValue : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void bad(const std::string& msg) { throw BadValue(msg); }

std::string scalar_of(const YAML::Node& n);  // a single, UTF-8 value
int64_t parse_int(const YAML::Node& n);      // also integral floats written as 1e3
double parse_double(const YAML::Node& n);    // finite
bool parse_bool(const YAML::Node& n);        // true/yes/on/1, false/no/off/0
std::string fmt_double(double v);            // shortest text that reads back as v
std::string quote(const std::string& s);     // as YAML would write it

// A list-of-maps value: the list itself (a null node is the empty list; else BadValue "expected a
// list of maps"), "entry N (line L)" of its item i for messages, and on(key, value) called for each
// key of item i, naming the item on a map expected, an unknown key (listing `keys`) or a bad value.
const YAML::Node& list_of(const YAML::Node& n);
std::string entry_where(size_t i, const YAML::Node& n);
void each_key(size_t i, const YAML::Node& item, const std::vector<std::string>& keys,
              const std::function<void(const std::string&, const YAML::Node&)>& on);

}  // namespace lm::config_values
