// The test hooks read from the environment, in one place: what a test may ask of the product's code
// through an environment variable, read when asked (a test may set or unset one in-process). None is set in a user's run;
// the test suite and the fault matrix set them (tests/CMakeLists.txt, tests/faults/).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace lm {

struct TestHooks {
  // LM_FAULT_KILL_IN_SAVE=<step>: the process SIGKILLs itself inside the save of that step
  // (trainer/checkpoint/writer.cpp), to prove an interrupted save never commits.
  int64_t kill_in_save_step = 0;
  // LM_FAULT_NAN_STEP=<step>: that step's loss and gradients are NaN (trainer/step/step.cpp), to prove the
  // non-finite step is skipped and recorded.
  int64_t nan_step = 0;
  // LM_ZERO_REDUCE_SCATTER=1: a sharded strategy on Gloo behaves as if the backend reduce-scattered
  // (an all-reduce of a copy, only the owned pieces kept: trainer/parallel/), so the NCCL
  // path's arithmetic runs on the CPU.
  bool emulate_reduce_scatter = false;
  // LM_TEST_WEIGHTS_RESIDENT=1: a strategy that releases the weights' pages counts the resident ones
  // (mincore) after every gather and logs the peak (trainer/parallel/zero3.cpp).
  bool measure_weights_resident = false;
  // LM_TEST_PEAK_TFLOPS=<x>: the CPU MFU peak is x TFLOP/s instead of an SGEMM measured at start
  // (trainer/runtime/device.cpp), which costs each of the suite's short trainer processes ~0.5 s.
  double peak_tflops = 0;
  // LM_TEST_MKLDNN=0: LibTorch's oneDNN is off in the process (trainer/runtime/device.h:
  // apply_kernel_test_hooks), so bf16 matrix products take LibTorch's own fallback gemm, as they
  // do on a CPU without AVX-512 (the test command's `kernels` phase, docs/testing.md).
  bool mkldnn_off = false;
};

inline TestHooks test_hooks() {
  TestHooks h;
  if (const char* v = std::getenv("LM_FAULT_KILL_IN_SAVE")) h.kill_in_save_step = std::atoll(v);
  if (const char* v = std::getenv("LM_FAULT_NAN_STEP")) h.nan_step = std::atoll(v);
  if (const char* v = std::getenv("LM_ZERO_REDUCE_SCATTER")) h.emulate_reduce_scatter = std::strcmp(v, "1") == 0;
  if (const char* v = std::getenv("LM_TEST_WEIGHTS_RESIDENT")) h.measure_weights_resident = std::strcmp(v, "1") == 0;
  if (const char* v = std::getenv("LM_TEST_PEAK_TFLOPS")) h.peak_tflops = std::atof(v);
  if (const char* v = std::getenv("LM_TEST_MKLDNN")) h.mkldnn_off = std::strcmp(v, "0") == 0;
  return h;
}

}  // namespace lm
