// The test hooks (common/test_hooks.h) of a program a test started: each hook set in the process's
// environment under its name is loaded into the registry, once, at start. Called by the trainer's
// main and by every LibTorch test suite (tests/kernel_hooks.cpp); nothing else reads them from the
// environment.
#pragma once

namespace lm {

// Throws UsageError naming a hook whose value it does not take.
void load_test_hooks_from_environment();

}  // namespace lm
