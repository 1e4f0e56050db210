// Stop signals by phase (see stop_signal.h). The handler makes only async-signal-safe calls.
#include "trainer/runtime/stop_signal.h"

#include <unistd.h>

#include <atomic>
#include <csignal>

namespace lm::stop_signal {
namespace {

std::atomic<bool> g_training{false};
std::atomic<int> g_signal{0};

extern "C" void on_stop_signal(int sig) {
  if (!g_training.load()) {
    static const char kTerm[] = "trainer: stopped by SIGTERM during start-up (nothing to save yet)\n";
    static const char kInt[] = "trainer: stopped by SIGINT during start-up (nothing to save yet)\n";
    const bool term = sig == SIGTERM;
    (void)!::write(2, term ? kTerm : kInt, (term ? sizeof kTerm : sizeof kInt) - 1);
    ::_exit(128 + sig);
  }
  if (g_signal.exchange(sig) != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

}  // namespace

void install() {
  g_training.store(false);
  std::signal(SIGTERM, on_stop_signal);
  std::signal(SIGINT, on_stop_signal);
}

void training_started() { g_training.store(true); }

int requested() { return g_signal.load(); }

}  // namespace lm::stop_signal
