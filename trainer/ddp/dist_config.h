// Configuration of data-parallel training (YAML section `dist:`). Torch-free.
// The keys' descriptions and allowed values are in describe() in trainer/config.cpp; `trainer --keys`
// prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct DistConfig {
  std::string backend = "auto";
  double timeout_s = 300;
  double bucket_mb = 25;
  int64_t zero = 0;  // 1: ZeRO-1, the AdamW moments sharded over the ranks (ddp/zero.h)

  bool zero1(int world) const { return zero == 1 && world > 1; }  // the one test of whether it applies

  bool backend_auto() const { return backend == "auto"; }
};

}  // namespace lm
