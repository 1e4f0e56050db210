// Clocks (see clock.h).
#include "common/clock.h"

#include <unistd.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace lm::clock {

double process_age_s() {
  std::ifstream stat("/proc/self/stat"), up("/proc/uptime");
  std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  double uptime = 0;
  up >> uptime;
  auto rp = s.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream rest(s.substr(rp + 2));
  std::string field;
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) start_ticks = std::stoull(field);
  return uptime - static_cast<double>(start_ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

double host_steal_s(const std::string& stat_path) {
  std::ifstream in(stat_path);
  std::string cpu;
  double v[8];
  if (!(in >> cpu) || cpu != "cpu") return -1;
  for (double& x : v)  // user nice system idle iowait irq softirq steal
    if (!(in >> x)) return -1;
  return v[7] / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

StealMeter::StealMeter() : steal_s_(host_steal_s()), t_(Steady::now()) {}

void StealMeter::advance(double* stolen_s, double* wall_s) {
  const double now = host_steal_s();
  *stolen_s = now >= 0 && steal_s_ >= 0 ? now - steal_s_ : std::nan("");
  *wall_s = seconds_since(t_);
  steal_s_ = now, t_ = Steady::now();
}

double StealMeter::take_s() {
  double stolen, wall;
  advance(&stolen, &wall);
  return std::isnan(stolen) ? 0 : stolen;
}

double StealMeter::take_pct() {
  double stolen, wall;
  advance(&stolen, &wall);
  const long cpus = ::sysconf(_SC_NPROCESSORS_ONLN);
  if (std::isnan(stolen) || wall <= 0 || cpus <= 0) return std::nan("");
  return 100.0 * stolen / (wall * static_cast<double>(cpus));
}

}  // namespace lm::clock
