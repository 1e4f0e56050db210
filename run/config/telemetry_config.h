// Configuration of logging and metrics (`log:`) and of anomaly detection (`anomaly:`). Torch-free.
// The keys' descriptions and allowed values are in describe_log and describe_anomaly
// (telemetry_config.cpp); `trainer --keys` prints them with the defaults below.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace lm {
namespace config_schema {
class Schema;
}

struct LogConfig {
  int64_t every_steps = 10;
  double peak_tflops = 0;
  double long_window_s = 3600;
  bool tensorboard = true;
  std::string profile_steps;
};

struct AnomalyConfig {
  double spike_factor = 3.0;
  int64_t window = 50;
  int64_t warmup_steps = 50;
  std::string action = "skip";
  int64_t max_dumps = 20;

  // The one comparison of each action.
  bool stops() const { return action == "stop"; }
  bool continues() const { return action == "continue"; }
  bool skips() const { return action == "skip"; }
};

// Parses "A-B" with 1 <= A <= B. The one parser of log.profile_steps (the config's validation and
// the profiler, profiler.h, use it).
inline bool parse_step_range(const std::string& text, int64_t* a, int64_t* b) {
  long long x = 0, y = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lld-%lld%c", &x, &y, &tail) != 2 || x < 1 || y < x) return false;
  *a = x, *b = y;
  return true;
}

// The log.* and anomaly.* keys into the config schema (run/config/config.cpp's describe()).
void describe_log(config_schema::Schema& s, LogConfig& l);
void describe_anomaly(config_schema::Schema& s, AnomalyConfig& a);

}  // namespace lm
