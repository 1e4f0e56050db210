// Linked into every LibTorch suite: the test hooks loaded from the suite's environment
// (common/test_hooks.h) and their kernel switches (LM_TEST_MKLDNN=0, set by the `kernels` runs of
// tests/CMakeLists.txt) applied before the first test, as the trainer applies them in
// configure_math, so the suite's own products take the kernels the trainers it starts take.
#include "trainer/runtime/device.h"
#include "trainer/runtime/test_env.h"

namespace lm {
namespace {
struct ApplyKernelHooks {
  ApplyKernelHooks() {
    load_test_hooks_from_environment();
    apply_kernel_test_hooks();
  }
} apply_kernel_hooks_at_start;
}  // namespace
}  // namespace lm
