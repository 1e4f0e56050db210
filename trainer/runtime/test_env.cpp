// The test hooks from the environment (see test_env.h).
#include "trainer/runtime/test_env.h"

#include <cstdlib>

#include "common/test_hooks.h"

namespace lm {

void load_test_hooks_from_environment() {
  for (const auto& h : test_hook_list())
    if (const char* v = std::getenv(h.name)) set_test_hook(h.name, v);
}

}  // namespace lm
