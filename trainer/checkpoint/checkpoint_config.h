// Configuration of checkpointing and resume (YAML section `checkpoint:`). Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct CheckpointConfig {
  int64_t every_steps = 0;       // save every N steps; 0 = only at the end; -1 = "auto" (Young/Daly)
  double mtbf_hours = 24.0;      // mean time between failures of ONE node (every_steps: auto); job: / nodes
  int64_t keep_last = 3;         // newest N checkpoints kept; 0 = keep all
  int64_t keep_every = 0;        // steps that are multiples of this are never deleted; 0 = none
  std::string resume = "auto";   // auto (newest valid in RUN_DIR) | none | a checkpoint directory
  bool force = false;            // resume even when model architecture or data version differ
  bool async = false;            // snapshot and write in the background while training continues
  std::string on_error = "stop"; // a failed save: stop (exit 1) | continue (warn, keep training)

  // The one comparison of each choice.
  bool stop_on_error() const { return on_error == "stop"; }
  bool resume_auto() const { return resume == "auto"; }
  bool resume_none() const { return resume == "none"; }
  double commit_timeout_s = 600; // rank 0 waits this long for the other ranks' files
};

}  // namespace lm
