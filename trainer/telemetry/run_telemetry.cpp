// The run's records (see run_telemetry.h).
#include "trainer/telemetry/run_telemetry.h"

#include <algorithm>
#include <cmath>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "run/run_dir.h"
#include "trainer/telemetry/anomaly.h"
#include "run/records.h"

namespace lm {

using clock::unix_now;

RunTelemetry::RunTelemetry(const LogConfig& log, const AnomalyConfig& anomaly, TelemetryRuntime rt)
    : log_cfg_(log), anomaly_(anomaly), rt_(std::move(rt)), rank_(rt_.rank), world_(rt_.world), device_(rt_.device),
      detector_(anomaly) {}

void RunTelemetry::start(const std::string& command, RunFacts facts, ResumeFacts resume) {
  resume_ = std::move(resume);
  start_step_ = std::max<int64_t>(0, resume_.step);
  peak_ = mfu_peak(log_cfg_.peak_tflops, facts.gpu.model, rt_.dtype, device_);
  log::info(peak_.flops <= 0 ? "MFU unknown: no peak for " + facts.gpu.model + " (set log.peak_tflops)"
                             : strf("MFU against %.4g TFLOP/s (%s): matmul FLOPs of the non-pad tokens (models/gpt.h) "
                                    "over the steps' wall time (data wait, upload, forward, backward, all-reduce, "
                                    "clipping, optimizer and EMA; not validation, checkpoint saves or logging)",
                                    peak_.flops / 1e12, peak_.source.c_str()));
  if (rank_ != 0) return;
  MetricsSink::Options mo;
  mo.run_dir = rt_.run_dir;
  mo.keep_through_step = resume_.step;
  mo.tensorboard = log_cfg_.tensorboard;
  mo.total_steps = rt_.max_steps;
  mo.long_window_s = log_cfg_.long_window_s;
  sink_ = std::make_unique<MetricsSink>(mo);
  long_window_.sink = sink_.get();
  if (long_window_.pending.is_object() && !long_window_.pending.empty()) sink_->load_window_state(long_window_.pending);
  facts.command = command;
  config_ = facts.config;  // anomaly evidence carries it
  record_ = std::make_unique<RunRecord>(rt_.run_dir, describe_run(facts));
}

void RunTelemetry::add_step(const TrainLog::Step& s) {
  log_.add(s);
  ++steps_seen_;
  if (s.timed) ++eta_steps_, eta_s_ += s.seconds;
  if (rank_ == 0 && !eta_logged_) log_eta();
  window_nonfinite_ |= !std::isfinite(s.loss) || !std::isfinite(s.z_loss);
  if (resume_.step < 0) return;
  if (sink_)
    sink_->write({{records::kKind, records::kResume}, {records::kStep, resume_.step + 1},
                  {records::kCheckpointDir, resume_.dir}, {records::kTime, unix_now()},
                  {records::kRecoveryMs, 1e3 * clock::process_age_s()}, {records::kLoadMs, resume_.load_ms}});
  resume_.step = -1;
}

// A window with a non-finite step logs loss NaN (null in the file; TrainLog counts it as 0).
void RunTelemetry::train_record(const TrainFacts& f, SourceTokens& source_tokens) {
  if (rank_ == 0 && peak_.measured) refresh_peak(f.step);  // between steps: neither a step's time nor telemetry's
  const auto t0 = clock::Steady::now();  // building the record counts as telemetry (record_ms_)
  const auto w = log_.close();
  const bool nonfinite = window_nonfinite_;
  const double loss = nonfinite ? std::nan("") : w.loss;
  window_nonfinite_ = false;
  if (rank_ != 0) return;
  namespace r = records;
  nlohmann::json rec = {{r::kKind, r::kTrain}, {r::kStep, f.step}, {r::kTime, unix_now()}, {r::kLoss, loss},
                        {r::kLr, f.lr}, {r::kGradNorm, f.grad_norm}, {r::kTokensPerS, w.tokens_per_s},
                        {r::kTokensPerSRank, w.tokens_per_s / world_}, {r::kStepMs, w.step_ms},
                        {r::kDataWaitMs, w.wait_ms}, {r::kDataWaitPct, w.wait_pct}, {r::kMemMb, memory_mb(device_)},
                        {r::kTokens, f.tokens}, {r::kEpoch, f.epoch}, {r::kBatchHash, hex64(f.batch_hash)}};
  // MFU of rank 0's device: its matmul FLOPs over the window's step time, against the peak
  // (start() says which); unknown without one.
  rec[r::kMfuPct] = peak_.pct(w.flops_per_s);  // NaN (null) when unknown
  if (rt_.z_loss) rec[r::kZLoss] = nonfinite ? std::nan("") : w.z_loss;
  if (rt_.bucketed) rec[r::kPaddingPct] = w.padding_pct;
  rec[r::kCpuStealPct] = steal_.take_pct();  // NaN (null) when unknown
  source_tokens.close(rec);
  record_ms_ += 1e3 * clock::seconds_since(t0);
  sink_->write(std::move(rec));
}

void RunTelemetry::log_eta() {
  const int64_t step = start_step_ + steps_seen_, left = rt_.max_steps - step;
  if (left <= 0) eta_logged_ = true;
  if (eta_logged_ || eta_steps_ < 2 || (eta_steps_ < kEtaSteps && eta_s_ < 30)) return;
  eta_logged_ = true;
  const double per_step = eta_s_ / static_cast<double>(eta_steps_), eta = per_step * static_cast<double>(left);
  log::info(strf("estimated time to train.max_steps=%lld on this machine: %s (%lld steps left at %.1f ms/step, the "
                 "mean of steps %lld-%lld, after step %lld's warm-up; validation and checkpoint saves come on top)",
                 (long long)rt_.max_steps, duration_text(eta).c_str(), (long long)left, 1e3 * per_step,
                 (long long)(step - eta_steps_ + 1), (long long)step, (long long)(step - eta_steps_)));
}

void RunTelemetry::refresh_peak(int64_t step) {
  const auto last = peak_.measured_at;
  const double before = peak_.flops;
  if (peak_.refresh(peak_every_s_))
    log::info(strf("MFU peak raised at step %lld: SGEMM measured again between steps, %.4g TFLOP/s (was %.4g); MFU "
                   "from here against %.4g TFLOP/s, the best measured in this process",
                   (long long)step, peak_.flops / 1e12, before / 1e12, peak_.flops / 1e12));
  if (peak_.measured_at != last) peak_every_s_ = std::min(2 * peak_every_s_, 600.0);
}

std::string RunTelemetry::check_step(const StepFacts& s, const std::vector<data::Batch>& batches,
                                     const std::vector<data::Manifest>& sources) {
  std::string reason = detector_.check(s.step, s.loss, s.grad_norm);
  if (reason.empty()) return reason;
  const auto& recent = detector_.recent_losses();
  AnomalyFacts f{s.step, reason, anomaly_.action, s.loss, s.grad_norm, s.lr, world_, s.batch_hash,
                 {recent.begin(), recent.end()}, {}};
  if (rank_ == 0) {
    log::warn(strf("anomaly at step %lld: %s (action: %s)", (long long)f.step, f.reason.c_str(), f.action.c_str()));
    sink_->write({{records::kKind, records::kAnomaly}, {records::kStep, f.step}, {records::kTime, unix_now()},
                  {records::kReason, f.reason}, {records::kLoss, finite_or_null(f.loss)},
                  {records::kGradNorm, finite_or_null(f.grad_norm)}, {records::kAction, f.action},
                  {records::kBatchHash, hex64(f.batch_hash)}});
  }
  if (dumps_ < anomaly_.max_dumps) {
    ++dumps_;
    if (rank_ == 0) f.config = config_;
    write_anomaly_evidence(rt_.run_dir, rank_, f, batches, sources);
  }
  return reason;
}

void RunTelemetry::val_record(int64_t step, const std::string& data, const std::string& split, double loss,
                              double ema_loss) {
  val_loss_ = loss;
  if (rank_ != 0) return;
  nlohmann::json rec = {{records::kKind, records::kVal}, {records::kStep, step}, {records::kValData, data},
                        {records::kValSplit, split}, {records::kValLoss, loss}, {records::kTime, unix_now()}};
  if (!std::isnan(ema_loss)) rec[records::kValLossEma] = ema_loss;
  sink_->write(std::move(rec));
}

void RunTelemetry::task_record(int64_t step, const std::vector<TaskScore>& scores) {
  if (first_tasks_.empty()) first_tasks_ = scores;
  tasks_ = scores;
  if (rank_ != 0) return;
  namespace r = records;
  for (const auto& t : scores)
    sink_->write({{r::kKind, r::kTask}, {r::kStep, step}, {r::kTaskName, t.name}, {r::kTaskAcc, t.acc},
                  {r::kTaskAccNorm, t.acc_norm}, {r::kTaskExamples, t.examples}, {r::kTaskTruncated, t.truncated},
                  {r::kTime, unix_now()}});
}

void RunTelemetry::save_record(const SaveFacts& s) {
  if (rank_ != 0) return;
  const double mbps = s.write_ms > 0 ? s.mb / (s.write_ms / 1e3) : 0;
  log::info(strf("checkpoint %s: %.1f MB, blocked %.0f ms, written in %.0f ms (%.0f MB/s)%s", s.dir.c_str(), s.mb,
                 s.block_ms, s.write_ms, mbps, s.async ? ", async" : ""));
  sink_->write({{records::kKind, records::kCheckpoint}, {records::kStep, s.step}, {records::kTime, unix_now()},
                {records::kDir, s.dir}, {records::kAsync, s.async}, {records::kCkptBlockMs, s.block_ms},
                {records::kCkptWriteMs, s.write_ms}, {records::kCkptMb, s.mb}, {records::kCkptMbPerS, mbps},
                {records::kCkptStealMs, s.steal_ms}});
}

TrainSummary RunTelemetry::summary(int64_t steps, int64_t start_step, double wall_s) {
  TrainSummary sum;
  sum.steps = steps, sum.first_loss = log_.first_loss(), sum.last_loss = log_.last_loss();
  sum.val_loss = val_loss_, sum.wall_s = wall_s, sum.tokens_per_s = log_.tokens_per_s();
  sum.first_tasks = first_tasks_, sum.tasks = tasks_;
  if (rank_ != 0) return sum;
  const double pad_pct = log_.padding_pct();
  const bool bucketed = rt_.bucketed;
  // Without validation, no val loss is said (summary.json: null), never a number that reads as one.
  // A run stopped before its first logged window has no loss to say (first_loss is -1 then).
  const std::string loss = sum.first_loss < 0 ? std::string("no step logged")
                                              : strf("loss %.4f -> %.4f", sum.first_loss, sum.last_loss);
  // Each task's accuracy beside the loss: the first score of this process -> the last.
  std::string tasks;
  for (size_t i = 0; i < sum.tasks.size(); ++i)
    tasks += strf(" | %s acc %.1f%% -> %.1f%%", sum.tasks[i].name.c_str(), 100 * sum.first_tasks[i].acc, 100 * sum.tasks[i].acc);
  log::info(strf("done: %lld steps in %.1f s | %s%s%s | %.0f tok/s%s", (long long)sum.steps, sum.wall_s,
                 loss.c_str(), sum.val_loss ? strf(" | val loss %.4f", *sum.val_loss).c_str() : "", tasks.c_str(),
                 sum.tokens_per_s, bucketed ? strf(" | padding %.1f%%", pad_pct).c_str() : ""));
  const double n = static_cast<double>(std::max<int64_t>(1, steps - start_step));
  const double telemetry_ms = (record_ms_ + sink_->caller_ms()) / n;
  namespace r = records;
  nlohmann::json j{{r::kSteps, sum.steps}, {r::kFirstLoss, sum.first_loss}, {r::kLastLoss, sum.last_loss},
                   {r::kValLoss, sum.val_loss ? nlohmann::json(*sum.val_loss) : nlohmann::json(nullptr)}, {r::kTokensPerS, sum.tokens_per_s}, {r::kWallS, sum.wall_s},
                   {r::kWorldSize, world_}, {r::kTelemetryMsPerStep, telemetry_ms},
                   {r::kTelemetrySinkCpuMsPerStep, sink_->sink_cpu_ms() / n}};
  if (bucketed) j[r::kPaddingPct] = pad_pct;
  if (!sum.tasks.empty()) {
    nlohmann::json t = nlohmann::json::object();
    for (size_t i = 0; i < sum.tasks.size(); ++i)
      t[sum.tasks[i].name] = {{r::kAcc, sum.tasks[i].acc}, {r::kAccNorm, sum.tasks[i].acc_norm},
                              {r::kFirstAcc, sum.first_tasks[i].acc}, {r::kFirstAccNorm, sum.first_tasks[i].acc_norm},
                              {r::kExamples, sum.tasks[i].examples}};
    j[r::kTasks] = t;
  }
  files::write_file_atomic(run_dir::summary(rt_.run_dir), j.dump(2) + "\n");
  return sum;
}

void RunTelemetry::finish(const std::string& status, int exit_code, const std::string& error) {
  flush();
  try {
    if (record_) record_->finish(status, exit_code, error);
  } catch (const Error& e) {  // e.g. the disk that failed the run: its error is the one to report
    if (error.empty()) throw;
    log::debug(std::string("meta.json not updated: ") + e.what());
  }
}

}  // namespace lm
