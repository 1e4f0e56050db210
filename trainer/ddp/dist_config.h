// Configuration of data-parallel training (YAML section `dist:`). Torch-free.
#pragma once

#include <string>

namespace lm {

struct DistConfig {
  std::string backend = "auto";  // auto (nccl on CUDA, gloo on CPU) | nccl | gloo
  double timeout_s = 300;        // rendezvous and every collective fail after this long
  double bucket_mb = 25;         // gradient all-reduce bucket size

  bool backend_auto() const { return backend == "auto"; }
};

}  // namespace lm
