// log.profile_steps: a Chrome trace of optimizer steps A..B, RUN_DIR/profile/steps_A-B.rank<r>.trace.json,
// and the ops or GPU kernels that took the time, RUN_DIR/profile/steps_A-B.rank<r>.top.json.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "run/config/telemetry_config.h"  // parse_step_range

namespace lm {

// Records with Kineto where LibTorch has it (compat::kHasKineto: CPU ops, and on a CUDA device its
// kernels, memcpys and memsets), else with the legacy recorder (CPU ops). The top.json:
//   {"device": "cuda"|"cpu", "steps": [A, B], "window": "<what the times include>", "total_us": T,
//    "top": [{"name", "calls", "total_us", "pct"}, ... up to 30, by total_us descending]}
// On CUDA the device-side events by device time; on CPU the ops by self time (an op's time minus the
// ops it calls, per thread), so that no time counts twice and the pct (of T) add up to at most 100.
class StepProfiler {
 public:
  // range: log.profile_steps ("" = off; REQUIRES: valid when set); device: the run's device.
  StepProfiler(const std::string& range, const std::string& run_dir, int rank, const c10::Device& device);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;
  // Around each optimizer step; `step` counts the steps done before it.
  void before_step(int64_t step);
  void after_step(int64_t step_done);  // writes the trace and the summary after the range's last step

 private:
  struct Recording;
  void finish();
  int64_t from_ = 0, to_ = 0;
  c10::Device device_;
  std::string path_, top_path_;
  std::unique_ptr<Recording> rec_;
};

}  // namespace lm
