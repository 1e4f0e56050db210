// The config loader's value parsers and printers (internal to trainer/config.cpp): YAML scalars to
// typed values, values back to the shortest YAML text, and the structured data.sources /
// data.stages lists. Each throws BadValue (the message; the caller adds where it came from).
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/loader/data_config.h"
#include "trainer/train_config.h"

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

void parse_sources(const YAML::Node& n, std::vector<SourceConfig>* out);
void parse_stages(const YAML::Node& n, std::vector<StageConfig>* out);
std::string print_sources(const std::vector<SourceConfig>& v);
std::string print_stages(const std::vector<StageConfig>& v);
std::string sources_doc();
// eval.tasks: [{name, path, kind}]; a name [A-Za-z0-9_.-]+ and unique, a path, kind multiple_choice.
void parse_tasks(const YAML::Node& n, std::vector<TaskConfig>* out);
std::string print_tasks(const std::vector<TaskConfig>& v);  // data.sources' documentation (source_fields(), data_config.h)

}  // namespace lm::config_values
