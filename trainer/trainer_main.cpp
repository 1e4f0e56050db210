// build/bin/trainer CONFIG.yaml [dotted.key=value ...]
#include "common/errors.h"
#include "trainer/cli.h"

int main(int argc, char** argv) {
  return lm::run_main("trainer", [&] { return lm::trainer_cli(argc, argv); });
}
