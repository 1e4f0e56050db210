// log.profile_steps: a Chrome trace of optimizer steps A..B, RUN_DIR/profile/steps_A-B.rank<r>.trace.json.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

namespace lm {

// Parses "A-B" with 1 <= A <= B. The one parser of log.profile_steps (config validation uses it).
inline bool parse_step_range(const std::string& text, int64_t* a, int64_t* b) {
  long long x = 0, y = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lld-%lld%c", &x, &y, &tail) != 2 || x < 1 || y < x) return false;
  *a = x, *b = y;
  return true;
}

class StepProfiler {
 public:
  // range: log.profile_steps ("" = off; REQUIRES: valid when set).
  StepProfiler(const std::string& range, const std::string& run_dir, int rank);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  // Around each optimizer step; `step` counts the steps done before it.
  void before_step(int64_t step);
  void after_step(int64_t step_done);  // writes the trace after the range's last step

 private:
  struct Recording;
  int64_t from_ = 0, to_ = 0;
  std::string path_;
  std::unique_ptr<Recording> rec_;
};

}  // namespace lm
