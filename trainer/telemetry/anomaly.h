// Anomalies: a non-finite loss or grad norm, or a loss spike above anomaly.spike_factor x the running
// mean of the last anomaly.window normal steps; and the evidence kept for each one.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "data/format/manifest.h"
#include "data/loader/loader.h"
#include "common/torch/stateful.h"
#include "run/config/telemetry_config.h"

namespace lm {

class AnomalyDetector : public Stateful {
 public:
  explicit AnomalyDetector(const AnomalyConfig& cfg) : cfg_(cfg) {}
  // "" or why the step that ends at optimizer step `step` (1-based) is an anomaly. A normal loss
  // joins the running mean; an anomalous one does not.
  std::string check(int64_t step, double loss, double gnorm);
  const std::deque<double>& recent_losses() const { return recent_; }
  // State under "anomaly": {"recent_losses": [...]}.
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  AnomalyConfig cfg_;
  std::deque<double> recent_;
};

// What rank 0 records about an anomalous step (RUN_DIR/anomalies/step_N/step.json).
struct AnomalyFacts {
  int64_t step = 0;
  std::string reason, action;
  double loss = 0, grad_norm = 0, lr = 0;
  int world_size = 1;
  uint64_t batch_hash = 0;
  std::vector<double> recent_losses;
  nlohmann::json config;
};

// A JSON number, or null when not finite.
nlohmann::json finite_or_null(double v);

// Writes RUN_DIR/anomalies/step_<N>/rank_<r>.json: this rank's batches (token ids, and the shard,
// document and offset of each row: enough to replay the batch offline); rank 0 also step.json.
// sources: the data sources' manifests (one for data.train), indexed by SampleOrigin::source.
void write_anomaly_evidence(const std::string& run_dir, int rank, const AnomalyFacts& facts,
                            const std::vector<data::Batch>& batches, const std::vector<data::Manifest>& sources);

}  // namespace lm
