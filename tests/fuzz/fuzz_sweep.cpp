// Fuzzes the sweep file (launch/sweep/spec.h parse_sweep) and its expansion into named runs
// (launch/sweep/plan.h expand). The input is the sweep file; "base.yaml" exists next to it (empty).
// Contract: a ConfigError/UsageError, or a spec whose expansion is bounded and named.
#include "launch/sweep/plan.h"
#include "launch/sweep/spec.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  // Relative paths in a sweep file resolve against the current directory: the scratch directory.
  static const bool in_scratch = (fuzz::put_file("base.yaml", ""), ::chdir(fuzz::scratch_dir().c_str()) == 0);
  if (!in_scratch) std::abort();
  const std::string path = fuzz::put_file("sweep.yaml", std::string(reinterpret_cast<const char*>(data), size));
  fuzz::expect_typed([&] {
    auto spec = sweep::parse_sweep(path);
    (void)sweep::expand(spec);
  });
  return 0;
}
