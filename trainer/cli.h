// Entry points of the torch binaries, declared without torch headers so each main() compiles fast.
// Each returns the exit code; bad input throws the typed errors of errors.h, which run_main()
// turns into one line and exit code 2.
#pragma once

namespace lm {

// `trainer CONFIG.yaml [dotted.key=value ...]`
int trainer_cli(int argc, char** argv);
// `generate --run RUN_DIR [--prompt TEXT] [--tokens N] [--temperature T] [--top-k K] [--seed S]`
int generate_cli(int argc, char** argv);

}  // namespace lm
