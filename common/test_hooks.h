// The test hooks, in one registry: what a test may ask of the product's code, each under one name.
// None is set in a user's run. docs/testing.md lists them (a test checks the page names every one).
//
// A test sets a hook in-process (set_test_hook), or for a program it starts through that program's
// environment under the hook's name: a program that obeys hooks loads them once at start
// (trainer/runtime/test_env.h: the trainer, and every LibTorch test suite). Nothing in common/ reads
// the environment for them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lm {

struct TestHooks {
  // LM_FAULT_KILL_IN_SAVE=<step>: the process SIGKILLs itself inside the save of that step
  // (trainer/checkpoint/writer.cpp), to prove an interrupted save never commits.
  int64_t kill_in_save_step = 0;
  // LM_FAULT_NAN_STEP=<step>: that step's loss and gradients are NaN (trainer/step/step.cpp), to
  // prove the non-finite step is skipped and recorded.
  int64_t nan_step = 0;
  // LM_ZERO_REDUCE_SCATTER=1: a sharded strategy on Gloo behaves as if the backend reduce-scattered
  // (an all-reduce of a copy, only the owned pieces kept: trainer/parallel/), so the NCCL path's
  // arithmetic runs on the CPU.
  bool emulate_reduce_scatter = false;
  // LM_TEST_PEAK_TFLOPS=<x>: the CPU MFU peak is x TFLOP/s instead of an SGEMM measured at start
  // (trainer/telemetry/mfu.cpp), which costs each of the suite's short trainer processes ~0.5 s.
  double peak_tflops = 0;
  // LM_TEST_MKLDNN=0: LibTorch's oneDNN is off in the process (trainer/runtime/device.h:
  // apply_kernel_test_hooks), so bf16 matrix products take LibTorch's own fallback gemm, as they
  // do on a CPU without AVX-512 (the test command's `kernels` phase, docs/testing.md).
  bool mkldnn_off = false;
  // LM_INVARIANT_COMBINE=all-gather|doubling: how dist.invariant's ranks combine their subtree sums
  // (trainer/parallel/global_batch.h pick_combine), instead of the choice by world size (tests and
  // bench/invariant.sh run both).
  std::string invariant_combine;
};

// The process's hooks.
const TestHooks& test_hooks();

// Sets hook `name` ("LM_FAULT_NAN_STEP") from its text; "" clears it. false: no hook has that name.
// Throws UsageError naming the hook for a value it does not take.
bool set_test_hook(const std::string& name, const std::string& value);

// Every hook: its name and what it does, in TestHooks' order.
struct TestHookInfo {
  const char* name;
  const char* doc;
};
const std::vector<TestHookInfo>& test_hook_list();

}  // namespace lm
