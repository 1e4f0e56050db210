// The test hooks' registry (see test_hooks.h).
#include "common/test_hooks.h"

#include <cstdlib>

#include "common/errors.h"

namespace lm {
namespace {

TestHooks& hooks() {
  static TestHooks h;
  return h;
}

int64_t hook_integer(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw UsageError(name + "=" + v + ": expected an integer");
  return x;
}

bool hook_flag(const std::string& name, const std::string& v, const char* on) {
  if (v == on) return true;
  if (v.empty() || v == (std::string(on) == "1" ? "0" : "1")) return false;
  throw UsageError(name + "=" + v + ": expected 0 or 1");
}

}  // namespace

const TestHooks& test_hooks() { return hooks(); }

const std::vector<TestHookInfo>& test_hook_list() {
  static const std::vector<TestHookInfo> list = {
      {"LM_FAULT_KILL_IN_SAVE", "<step>: SIGKILL inside that step's checkpoint save, after its first file"},
      {"LM_FAULT_NAN_STEP", "<step>: that step's loss and gradients are NaN"},
      {"LM_ZERO_REDUCE_SCATTER", "1: ZeRO on Gloo takes the reduce-scatter path (an all-reduce of a copy, the owned pieces kept)"},
      {"LM_TEST_PEAK_TFLOPS", "<x>: the CPU MFU peak is x TFLOP/s, no SGEMM measured at start"},
      {"LM_TEST_MKLDNN", "0: oneDNN off in the process (bf16 products on LibTorch's fallback gemm)"},
      {"LM_INVARIANT_COMBINE", "all-gather|doubling: how dist.invariant's ranks combine their sums"},
  };
  return list;
}

bool set_test_hook(const std::string& name, const std::string& v) {
  TestHooks& h = hooks();
  if (name == "LM_FAULT_KILL_IN_SAVE") h.kill_in_save_step = v.empty() ? 0 : hook_integer(name, v);
  else if (name == "LM_FAULT_NAN_STEP") h.nan_step = v.empty() ? 0 : hook_integer(name, v);
  else if (name == "LM_ZERO_REDUCE_SCATTER") h.emulate_reduce_scatter = hook_flag(name, v, "1");
  else if (name == "LM_TEST_PEAK_TFLOPS") {
    char* end = nullptr;
    const double x = v.empty() ? 0 : std::strtod(v.c_str(), &end);
    if (!v.empty() && (*end != '\0' || !(x >= 0))) throw UsageError(name + "=" + v + ": expected a number >= 0");
    h.peak_tflops = x;
  } else if (name == "LM_TEST_MKLDNN") h.mkldnn_off = hook_flag(name, v, "0");
  else if (name == "LM_INVARIANT_COMBINE") {
    if (!v.empty() && v != "all-gather" && v != "doubling")
      throw UsageError(name + "=" + v + ": expected all-gather or doubling");
    h.invariant_combine = v;
  } else {
    return false;
  }
  return true;
}

}  // namespace lm
