// Clocks: monotonic intervals for timing, wall time for records, and this process's age.
#pragma once

#include <chrono>
#include <string>

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

// CPU time the hypervisor has taken from this machine's CPUs since boot, all CPUs together (the
// "steal" column of /proc/stat), in seconds; -1 when unknown. On a VM that is other guests' work
// and the host's own, such as its side of this guest's disk and network I/O.
double host_steal_s(const std::string& stat_path = "/proc/stat");

// The hypervisor's steal over intervals: each take_*() covers the time since the previous take
// (the first: since construction).
class StealMeter {
 public:
  StealMeter();
  // CPU seconds stolen, all CPUs together; 0 when unknown.
  double take_s();
  // The same as a share of all CPUs' time over the interval, in % (top's "st"); NaN when unknown.
  double take_pct();

 private:
  // Seconds stolen (NaN when unknown) and wall seconds since the last take; starts the next.
  void advance(double* stolen_s, double* wall_s);
  double steal_s_;
  Steady::time_point t_;
};

}  // namespace lm::clock
