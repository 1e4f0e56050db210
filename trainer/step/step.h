// One optimizer step: its device work (ForwardBackward: the step's micro-batches from the loader,
// forward and backward with bf16 autocast where on, gradients reduced over the ranks as the
// parallelism does it (trainer/parallel/parallel.h) and clipped) and its update (StepUpdate: the optimizer and the EMA, decided on the host after the
// anomaly check, or gated on the device with the host reading the step's results one step late).
// What the loop decides from the results (the anomaly check, saves, stops, records) stays in the loop.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "common/clock.h"
#include "data/loader/loader.h"
#include "models/lm.h"
#include "models/model_config.h"
#include "run/config/train_config.h"
#include "trainer/optim/optimizer.h"
#include "trainer/parallel/parallel.h"
#include "trainer/parallel/step_stats.h"
#include "trainer/optim/ema.h"
#include "trainer/runtime/device.h"
#include "trainer/telemetry/source_tokens.h"
#include "run/config/telemetry_config.h"

namespace lm {

class ForwardBackward {
 public:
  // Everything it reads or writes; each outlives it. comm: nullptr on one rank.
  // What a step is made from, by section; each outlives it.
  struct Parts {
    struct Config {  // the facts of the config it reads
      const TrainConfig* train = nullptr;      // grad_accum, dtype
      const ModelConfig* model = nullptr;      // the FLOPs per token of a batch's length
      bool reuse_batch = false;                // data.reuse_batch
      bool packed = true;                      // data.mode=packed: the targets are counted over every rank
      double grad_clip = 0;                    // optim.grad_clip
      bool z_loss = false;                     // optim.z_loss > 0: the z-loss is summed apart
    } config;
    struct Model {  // the model and who spreads its gradients (model_parts.h)
      LM lm{nullptr};
      FlatParams* flat = nullptr;
      Parallelism* parallel = nullptr;
    } model;
    struct Data {  // where the batches come from, and the per-source token counts
      data::Loader* loader = nullptr;
      SourceTokens* source_tokens = nullptr;
    } data;
    struct Runtime {  // where it runs
      Comm* comm = nullptr;
      torch::Device device = torch::kCPU;
      int world = 1;
      int64_t vocab = 0;  // padded
    } runtime;
  };
  explicit ForwardBackward(Parts p);

  // Step `step` (0-based): fills `batches` (grad_accum of them; data.reuse_batch keeps the first
  // ones), runs them and returns this rank's totals. *stats: (2,) float64 on the device, [loss sum,
  // grad norm before clipping (the same on every rank)], and with optim.z_loss > 0 (3,): [..., z-loss sum].
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

// A step's results as the host reads them.
struct StepResult {
  int64_t step = 0;  // 1-based
  RankStats mine;
  HostScalars stats;  // [loss sum, grad norm] (and the z-loss sum, optim.z_loss)
  double lr = 0, seconds = -1;  // seconds: set when the step is left pending
  clock::Steady::time_point t0;
  std::vector<data::Batch> kept;  // the batches, kept for anomaly evidence while pending
};

// The update after a step. Deferred (the fused optimizer on one rank, where no host decision must
// precede the update: anomaly.action continue, or skip without spike checks): the update and the
// EMA are queued gated on the device (found_inf: a non-finite loss or grad norm), nothing waits for
// the host, and the loop may read the step's results one step late (hold/take). Otherwise the host
// updates after the anomaly check (update()).
class StepUpdate {
 public:
  // parallel: told after each update (parallel.h after_update).
  StepUpdate(const AnomalyConfig& anomaly, Optimizer& opt, Ema* ema, int world, Parallelism& parallel);
  bool deferred() const { return deferred_; }
  // The step's results; where deferred() the update is queued on the device first. stats: as
  // ForwardBackward::run fills it.
  std::unique_ptr<StepResult> begin(int64_t step, double lr, RankStats mine, const torch::Tensor& stats,
                                    clock::Steady::time_point t0);
  // The host's update once the step is read (nothing where deferred(): it is queued already):
  // skipped after an anomaly unless anomaly.action is continue and the step is finite.
  void update(const std::string& anomaly, double loss, double grad_norm, double lr);
  // A step left unread (deferred() only) until the next one is under way.
  void hold(std::unique_ptr<StepResult> s, const std::vector<data::Batch>& batches);
  std::unique_ptr<StepResult> take() { return std::move(pending_); }

 private:
  const AnomalyConfig& anomaly_;
  Optimizer& opt_;
  Ema* ema_;
  Parallelism& parallel_;
  bool deferred_;
  std::unique_ptr<StepResult> pending_;
};

}  // namespace lm
