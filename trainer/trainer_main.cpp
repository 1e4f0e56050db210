// build/bin/trainer CONFIG.yaml [dotted.key=value ...]
#include "common/errors.h"
#include "trainer/cli.h"
#include "trainer/runtime/test_env.h"

int main(int argc, char** argv) {
  return lm::run_main("trainer", [&] {
    lm::load_test_hooks_from_environment();  // what a test asked of this process (common/test_hooks.h)
    return lm::trainer_cli(argc, argv);
  });
}
