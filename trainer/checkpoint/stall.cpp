// The real stall of a save (see stall.h).
#include "trainer/checkpoint/stall.h"

#include <algorithm>
#include <vector>

namespace lm {

double StallMeter::baseline_s() const {
  if (clean_.empty()) return 0;
  std::vector<double> v(clean_.begin(), clean_.end());
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

void StallMeter::step(double step_s, bool in_flight) {
  if (!in_flight) {
    clean_.push_back(step_s);
    if (clean_.size() > kWindow) clean_.pop_front();
    return;
  }
  ++overlapped_;
  excess_s_ += step_s;  // the baseline is subtracted in take(), when it is best known
}

double StallMeter::take(double fallback_s) {
  const double base = baseline_s();
  const double excess = excess_s_ - overlapped_ * base;
  excess_s_ = 0;
  const int n = overlapped_;
  overlapped_ = 0;
  if (clean_.empty()) return fallback_s;
  return n == 0 ? 0.0 : std::max(0.0, excess);
}

}  // namespace lm
