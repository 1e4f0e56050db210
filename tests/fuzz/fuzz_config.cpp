// Fuzzes the experiment file and its overrides (run/config/config.h load_config): input = YAML text,
// optionally followed by a line "#@overrides" and one "dotted.key=value" override per line.
// Contract: a ConfigError or a config; an accepted config survives to_yaml() -> load_config() with
// the same result (config.h promises the round trip) and to_json().
#include <sstream>

#include "tests/fuzz/fuzz_util.h"
#include "run/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lm;
  const auto [yaml, rest] = fuzz::split_at(std::string(reinterpret_cast<const char*>(data), size), "\n#@overrides\n");
  std::vector<std::string> overrides;
  std::istringstream lines(rest);
  for (std::string l; std::getline(lines, l);) overrides.push_back(l);
  const std::string path = fuzz::put_file("exp.yaml", yaml);
  fuzz::expect_typed([&] {
    ExperimentConfig cfg = load_config(path, overrides);
    const std::string once = to_yaml(cfg);
    const std::string again = to_yaml(load_config(fuzz::put_file("resolved.yaml", once), {}));
    if (once != again) {
      std::fprintf(stderr, "FUZZ FINDING: to_yaml round trip differs:\n%s\n---\n%s\n", once.c_str(), again.c_str());
      std::abort();
    }
    (void)to_json(cfg);
    (void)to_table(cfg);
  });
  return 0;
}
