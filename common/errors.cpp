// run_main(): the one place that turns exceptions into a line and an exit code (see errors.h).
#include "common/errors.h"

#include <cstdio>
#include <string>

namespace lm {

int run_main(const char* prog, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", prog, e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::string msg = e.what();
    // c10::Error carries a multi-line backtrace; keep its first line only.
    auto nl = msg.find('\n');
    if (nl != std::string::npos) msg.resize(nl);
    std::fprintf(stderr, "%s: error: %s\n", prog, msg.c_str());
    return kExitFailure;
  }
}

}  // namespace lm
