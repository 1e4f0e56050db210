// Step profiler (see profiler.h).
#include "trainer/telemetry/profiler.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include "common/files.h"
#include "common/log.h"
#include "trainer/run_dir.h"

namespace lm {

struct StepProfiler::Recording {
  explicit Recording(const std::string& path) : profile(path) {}
  torch::autograd::profiler::RecordProfile profile;
};

StepProfiler::StepProfiler(const std::string& range, const std::string& run_dir, int rank) {
  if (range.empty() || !parse_step_range(range, &from_, &to_)) return;
  path_ = run_dir::profile(run_dir) + "/" +
          strf("steps_%lld-%lld.rank%d.trace.json", (long long)from_, (long long)to_, rank);
}

StepProfiler::~StepProfiler() = default;

void StepProfiler::before_step(int64_t step) {
  if (from_ == 0 || step + 1 != from_) return;
  files::make_dirs(path_.substr(0, path_.rfind('/')));
  rec_ = std::make_unique<Recording>(path_);
}

void StepProfiler::after_step(int64_t step_done) {
  if (rec_ && step_done == to_) rec_.reset();  // writes the trace
}

}  // namespace lm
