// One optimizer step's device work: the step's micro-batches from the loader, forward and backward
// (bf16 autocast where on), gradients summed over the ranks (GradSync) and clipped. What the loop
// decides from its results (the anomaly check, the update, the records) stays in the loop.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "data/loader/loader.h"
#include "models/lm.h"
#include "trainer/config.h"
#include "trainer/ddp/grad_sync.h"
#include "trainer/ddp/step_stats.h"
#include "trainer/optim/adamw.h"
#include "trainer/runtime/device.h"
#include "trainer/telemetry/source_tokens.h"

namespace lm {

class ForwardBackward {
 public:
  // Everything it reads or writes; each outlives it. comm and grad_sync: nullptr on one rank.
  struct Parts {
    const ExperimentConfig* cfg;
    LM model;
    FlatParams* flat;
    data::Loader* loader;
    SourceTokens* source_tokens;
    Comm* comm;
    GradSync* grad_sync;
    torch::Device device;
    int world;
    int64_t vocab;
  };
  explicit ForwardBackward(Parts p);

  // Step `step` (0-based): fills `batches` (grad_accum of them; data.reuse_batch keeps the first
  // ones), runs them and returns this rank's totals. *stats: (2,) float64 on the device, [loss sum,
  // grad norm before clipping (the same on every rank)].
  RankStats run(std::vector<data::Batch>& batches, int64_t step, torch::Tensor* stats);
  // Loader batches returned before the last run() began (a checkpoint after a failed read resumes
  // at that step's first micro-batch).
  uint64_t batches_before() const { return batches_before_; }

 private:
  Parts p_;
  BatchUploader uploader_;
  bool bf16_;
  uint64_t batches_before_ = 0;
  // Fault injection for tests: LM_FAULT_NAN_STEP=<step> makes that step's loss and gradients NaN.
  const int64_t fault_nan_step_;
};

}  // namespace lm
