// Configuration of data-parallel training (YAML section `dist:`). Torch-free.
// The keys' descriptions and allowed values are in describe() in trainer/config.cpp; `trainer --keys`
// prints them with the defaults below.
#pragma once

#include <string>

namespace lm {

struct DistConfig {
  std::string backend = "auto";
  double timeout_s = 300;
  double bucket_mb = 25;

  bool backend_auto() const { return backend == "auto"; }
};

}  // namespace lm
