// The checkpoint interval policy (see interval.h).
#include "trainer/checkpoint/interval.h"

#include <algorithm>
#include <cmath>

#include "common/log.h"

namespace lm {

bool SaveInterval::due(int64_t step, int64_t last_save_step, double step_s) {
  if (cfg_.every_steps > 0) return step % cfg_.every_steps == 0;
  if (cfg_.every_steps == 0 || step_s <= 0) return false;
  const double cost_s = cost_s_ >= 0 ? cost_s_ : std::max(0.05, state_mb_ / 200.0);
  const double job_mtbf_s = cfg_.mtbf_hours * 3600.0 / nodes_;
  const double interval_s = std::sqrt(2.0 * job_mtbf_s * cost_s);
  const int64_t interval = std::max<int64_t>(1, std::llround(interval_s / step_s));
  if (interval != interval_ && log_)
    log::info(strf("checkpoint interval: %lld steps (Young/Daly: save stall %.3f s, job MTBF %.2f h = %.2f h "
                   "per node / %d nodes, %.3f s/step)",
                   (long long)interval, cost_s, job_mtbf_s / 3600.0, cfg_.mtbf_hours, nodes_, step_s));
  interval_ = interval;
  return step - last_save_step >= interval;
}

}  // namespace lm
