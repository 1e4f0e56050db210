// build/bin/generate --run RUN_DIR [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K]
#include "common/errors.h"
#include "trainer/cli.h"

int main(int argc, char** argv) {
  return lm::run_main("generate", [&] { return lm::generate_cli(argc, argv); });
}
