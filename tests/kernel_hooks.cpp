// Linked into every LibTorch suite: the kernel switches of the test hooks (LM_TEST_MKLDNN=0, set by
// the `kernels` runs of tests/CMakeLists.txt) applied before the first test, as the trainer applies
// them in configure_math, so the suite's own products take the kernels the trainers it starts take.
#include "trainer/runtime/device.h"

namespace lm {
namespace {
struct ApplyKernelHooks {
  ApplyKernelHooks() { apply_kernel_test_hooks(); }
} apply_kernel_hooks_at_start;
}  // namespace
}  // namespace lm
