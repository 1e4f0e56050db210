// What a save really costs the training thread: the time save() blocks, plus, for an async save,
// how much longer the steps that ran while it was in flight took than steps with none in flight
// (the writer competes for CPUs and memory bandwidth, and the next update may wait at the fence
// for the staging copy). Timing only the save() call (or a fork) misses all of that.
// Not thread-safe: the training thread alone calls it.
#pragma once

#include <cstddef>
#include <deque>

namespace lm {

class StallMeter {
 public:
  // A step of step_s seconds finished; in_flight: an async save was running during it.
  void step(double step_s, bool in_flight);
  // The extra time of the in-flight steps since the last take(), in seconds (>= 0), or `fallback_s`
  // when no step without a save was seen yet (no baseline). Resets the accumulator.
  double take(double fallback_s);
  // Median of the recent steps without a save in flight; 0 before the first one.
  double baseline_s() const;

 private:
  static constexpr size_t kWindow = 15;
  std::deque<double> clean_;  // recent steps without a save in flight
  double excess_s_ = 0;
  int overlapped_ = 0;
};

}  // namespace lm
