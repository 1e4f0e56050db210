// Configuration of checkpointing and resume (YAML section `checkpoint:`). Torch-free.
// The keys' descriptions and allowed values are in describe_checkpoint (checkpoint_config.cpp);
// `trainer --keys` prints them with the defaults below.
#pragma once

#include <cstdint>
#include <string>

namespace lm {
namespace config_schema {
class Schema;
}

struct CheckpointConfig {
  int64_t every_steps = 0;
  double mtbf_hours = 24.0;
  int64_t keep_last = 3;
  int64_t keep_every = 0;
  std::string resume = "auto";
  bool force = false;
  bool async = false;
  double write_pace = 0.5;
  std::string on_error = "stop";
  double commit_timeout_s = 600;

  // The one comparison of each choice.
  bool stop_on_error() const { return on_error == "stop"; }
  bool resume_auto() const { return resume == "auto"; }
  bool resume_none() const { return resume == "none"; }
};

// The checkpoint.* keys into the config schema (run/config/config.cpp's describe()).
void describe_checkpoint(config_schema::Schema& s, CheckpointConfig& ck);

}  // namespace lm
