// Clocks: monotonic intervals for timing, wall time for records, and this process's age.
#pragma once

#include <chrono>

namespace lm::clock {

using Steady = std::chrono::steady_clock;

inline double seconds_since(Steady::time_point t) {
  return std::chrono::duration<double>(Steady::now() - t).count();
}
inline double ms_since(Steady::time_point t) {
  return std::chrono::duration<double, std::milli>(Steady::now() - t).count();
}
// Wall time as unix seconds (metrics records).
inline double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
// Seconds since this process started, from /proc (includes dynamic loading before main); 0 when
// unknown.
double process_age_s();

}  // namespace lm::clock
