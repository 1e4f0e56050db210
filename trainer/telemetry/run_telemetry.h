// The run's records, built here so that the loop only says what happened: metrics.jsonl and
// TensorBoard (the sink), meta.json, summary.json, the log's checkpoint and "done" lines, the MFU
// against the device's peak and the CPU steal. Rank 0 writes them; every rank keeps the window
// arithmetic (TrainLog, state key "metrics") and the sink's long window (state key "long_window").
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "run/config/telemetry_config.h"
#include "trainer/runtime/device.h"
#include "trainer/telemetry/mfu.h"
#include "common/torch/stateful.h"
#include "trainer/telemetry/anomaly.h"
#include "trainer/telemetry/metrics.h"
#include "trainer/telemetry/run_record.h"
#include "trainer/telemetry/source_tokens.h"
#include "trainer/telemetry/task_score.h"
#include "trainer/telemetry/train_log.h"

namespace lm {

struct TrainSummary {
  int64_t steps = 0;
  double first_loss = 0, last_loss = 0;  // mean loss of the first / last logging window
  std::optional<double> val_loss;        // last validation loss; none when none ran
  std::vector<TaskScore> first_tasks, tasks;  // eval.tasks' first and last scores; empty when none ran
  double tokens_per_s = 0;               // over all steps after the first
  double wall_s = 0;
};

// A "train" record's facts besides the window's means.
struct TrainFacts {
  int64_t step = 0;
  double lr = 0, grad_norm = 0;
  int64_t tokens = 0, epoch = 0;
  uint64_t batch_hash = 0;
};

// Where a resumed run came from (step -1: a fresh run).
struct ResumeFacts {
  int64_t step = -1;  // the checkpoint's step
  std::string dir;
  double load_ms = 0;
};

// A step's facts the anomaly check reads.
struct StepFacts {
  int64_t step = 0;  // 1-based
  double loss = 0, grad_norm = 0, lr = 0;
  uint64_t batch_hash = 0;
};

// A finished checkpoint save, as the checkpointer reports it.
struct SaveFacts {
  int64_t step = 0;
  std::string dir;
  bool async = false;
  double block_ms = 0, write_ms = 0, mb = 0, steal_ms = 0;
};

// What telemetry needs of the run besides its log: and anomaly: sections.
struct TelemetryRuntime {
  std::string run_dir;     // run.dir
  int64_t max_steps = 0;   // train.max_steps
  std::string dtype;       // train.dtype: the MFU peak's
  bool z_loss = false;     // optim.z_loss > 0: train records carry z_loss
  bool bucketed = false;   // data.mode=bucketed: train records and the summary carry padding_pct
  int rank = 0, world = 1;
  torch::Device device = torch::kCPU;
};

class RunTelemetry {
 public:
  RunTelemetry(const LogConfig& log, const AnomalyConfig& anomaly, TelemetryRuntime rt);

  TrainLog& train_log() { return log_; }
  Stateful& long_window() { return long_window_; }
  AnomalyDetector& detector() { return detector_; }

  // The MFU peak (the device's), the sink and meta.json (rank 0). A resumed run keeps its
  // metrics.jsonl up to resume.step and gets a "resume" record with its first step.
  void start(const std::string& command, RunFacts facts, ResumeFacts resume);
  // One optimizer step's totals (every rank).
  void add_step(const TrainLog::Step& s);
  // "" or why the step is an anomaly (every rank: the same global facts, the same answer); an
  // anomaly is logged and recorded, and the first anomaly.max_dumps get their evidence (anomaly.h).
  // sources: the data sources' manifests, indexed by SampleOrigin::source.
  std::string check_step(const StepFacts& f, const std::vector<data::Batch>& batches,
                         const std::vector<data::Manifest>& sources);
  // Closes the logging window: a "train" record (rank 0).
  void train_record(const TrainFacts& f, SourceTokens& source_tokens);
  void val_record(int64_t step, const std::string& data, const std::string& split, double loss, double ema_loss);
  // eval.tasks' scores at `step`: one "task" record per task (rank 0); the first and the last are
  // kept for the summary.
  void task_record(int64_t step, const std::vector<TaskScore>& scores);
  void save_record(const SaveFacts& s);
  // The sink's first write error since the last call ("" when none).
  std::string take_error() { return sink_ ? sink_->take_error() : ""; }
  void flush() {
    if (sink_) sink_->flush();
  }
  // The run's totals: logged and written to summary.json (rank 0); val_loss: the last val_record's.
  TrainSummary summary(int64_t steps, int64_t start_step, double wall_s);
  // meta.json's final status ("completed", "stopped", "failed").
  void finish(const std::string& status, int exit_code, const std::string& error);

 private:
  // The sink's long window: restored before the sink exists, handed to it at start().
  struct LongWindow : Stateful {
    MetricsSink* sink = nullptr;
    nlohmann::json pending;
    ComponentState state() const override { return {sink ? sink->window_state() : nlohmann::json::object(), {}}; }
    void load_state(const ComponentState* st) override { pending = st ? st->values : nlohmann::json(); }
  };

  const LogConfig log_cfg_;
  const AnomalyConfig anomaly_;
  const TelemetryRuntime rt_;
  int rank_, world_;
  torch::Device device_;
  TrainLog log_;
  LongWindow long_window_;
  AnomalyDetector detector_;
  ResumeFacts resume_;  // until its record is written
  nlohmann::json config_;  // the resolved config (RunFacts::config; rank 0)
  MfuPeak peak_;
  // A measured (CPU) peak is measured again between steps at a train record this often (30 s,
  // doubling to 10 min: at most ~0.2 s each), the best kept: a start-up measurement on a busy host
  // would otherwise inflate every MFU of the run.
  double peak_every_s_ = 30;
  void refresh_peak(int64_t step);
  // The estimated time to train.max_steps, logged once (rank 0) after kEtaSteps steps past the
  // process's first (its warm-up), or 2 when they took 30 s.
  static constexpr int64_t kEtaSteps = 5;
  int64_t start_step_ = 0, steps_seen_ = 0, eta_steps_ = 0;
  double eta_s_ = 0;
  bool eta_logged_ = false;
  void log_eta();
  clock::StealMeter steal_;  // cpu_steal_pct of the train records (rank 0)
  std::unique_ptr<MetricsSink> sink_;  // rank 0
  std::unique_ptr<RunRecord> record_;  // rank 0
  double record_ms_ = 0;               // rank 0 building train records (telemetry's own cost)
  bool window_nonfinite_ = false;      // a step of the open window was non-finite
  int64_t dumps_ = 0;                  // anomaly evidence directories written
  std::optional<double> val_loss_;     // the last validation loss (none: none ran)
  std::vector<TaskScore> first_tasks_, tasks_;  // the first and the last task scores of this process
};

}  // namespace lm
