// Configuration of the parallelism (YAML section `dist:`). Torch-free. The keys' descriptions and
// allowed values are in describe_dist (dist_config.cpp); `trainer --keys` prints them with the
// defaults below.
#pragma once

#include <cstdint>
#include <string>

namespace lm {
namespace config_schema {
class Schema;
}

struct DistConfig {
  std::string backend = "auto";
  double timeout_s = 300;
  double bucket_mb = 25;
  int64_t zero = 0;  // which strategy shards what (parallel.cpp's table picks it)
  bool invariant = false;  // the same bits at any world size (trainer/parallel/invariant.h)

  bool backend_auto() const { return backend == "auto"; }
};

// The dist.* keys into the config schema (run/config/config.cpp's describe()).
void describe_dist(config_schema::Schema& s, DistConfig& d);

}  // namespace lm
