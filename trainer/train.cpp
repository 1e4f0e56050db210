// The training loop (see train.h): the Trainer composes the components and runs the steps. Each
// component owns its config, its state (trainer/stateful.h, bound to a fixed key in
// register_state) and its records; the loop below reads top to bottom as the step it runs.
#include "trainer/train.h"

#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <vector>

#include "common/build_info.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/torch/compat.h"
#include "common/dir_lock.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "data/loader/loader.h"
#include "data/remote/store.h"
#include "models/build.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/hf_dir.h"
#include "trainer/checkpoint/state.h"
#include "trainer/ddp/grad_sync.h"
#include "trainer/ddp/launch_env.h"
#include "trainer/ddp/step_stats.h"
#include "trainer/evaluate.h"
#include "trainer/memory_check.h"
#include "trainer/model_parts.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/ema.h"
#include "trainer/optim/schedule.h"
#include "trainer/resume.h"
#include "trainer/run_dir.h"
#include "trainer/runtime/device.h"
#include "trainer/runtime/host_allocator.h"
#include "trainer/runtime/rng.h"
#include "trainer/step.h"
#include "trainer/stop_signal.h"
#include "trainer/telemetry/anomaly.h"
#include "trainer/telemetry/profiler.h"
#include "trainer/telemetry/run_telemetry.h"
#include "trainer/telemetry/source_tokens.h"

namespace lm {
namespace {

using Clock = clock::Steady;
using clock::seconds_since;

// The run's position (state key "progress"): optimizer steps and target tokens done.
struct Progress : Stateful {
  int64_t step = 0, start_step = 0, tokens = 0;
  const data::Loader* loader = nullptr;
  int64_t epoch() const {
    return static_cast<int64_t>(loader->state().cursor) / std::max<int64_t>(1, loader->samples_per_epoch());
  }
  ComponentState state() const override { return {{{"step", step}, {"tokens", tokens}, {"epoch", epoch()}}, {}}; }
  void load_state(const ComponentState* s) override {
    step = start_step = s->values.at("step").get<int64_t>();
    tokens = s->values.at("tokens").get<int64_t>();
  }
};

// The data loader's position (state key "loader", per rank); checkpoint.force passes through.
struct LoaderPosition : Stateful {
  data::Loader* loader = nullptr;
  bool force = false;
  ComponentState state() const override { return {nlohmann::json::parse(loader->state().to_json()), {}}; }
  void load_state(const ComponentState* s) override {
    loader->load_state(data::LoaderState::from_json(s->values.dump()), force);
  }
};

class Trainer {
 public:
  // Every input is checked before anything is printed or written.
  Trainer(const ExperimentConfig& cfg, const std::string& command)
      : cfg_(cfg), launch_(LaunchEnv::from_environment()), device_(pick_device(cfg.train.device, launch_.local_rank)),
        rank_(launch_.rank), world_(launch_.world_size), rng_(device_), detector_(cfg.anomaly),
        schedule_(cfg.schedule, cfg.optim.lr, cfg.train.max_steps, &progress_.step),
        telemetry_(cfg_, rank_, world_, device_) {
    open_data();
    check_memory_fits(cfg, vocab_, device_);  // before anything is allocated or written
    open_run_dir();
    ckpt_ = std::make_unique<Checkpointer>(cfg.checkpoint, cfg.run.dir, rank_, world_,
                                           std::max(1, world_ / std::max(1, launch_.local_world_size)));
    resume_ = find_resume(*ckpt_, cfg.checkpoint, comm_.get(), rank_);
    if (!resume_.dir.empty())
      check_compatible(resume_, arch_json(cfg.model, vocab_), data_.resume_version(), cfg.checkpoint.force);
    if (rank_ == 0) {
      log::info("trainer: " + command);
      log::info("resolved config (* = not the default):\n" + to_table(cfg));
      files::write_file_atomic(run_dir::config(cfg.run.dir), to_yaml(cfg));
      data_.save_tokenizer(run_dir::tokenizer(cfg.run.dir));
    }
    build_model();
    register_state();
    if (!resume_.dir.empty()) restore();
    if (comm_) {
      comm_->broadcast(m_.flat->params(), 0, "broadcast of the initial parameters");
      grad_sync_ = std::make_unique<GradSync>(*comm_, *m_.flat, *m_.model, cfg.dist.bucket_mb);
      log::info(strf("data parallel: %s, %zu gradient buckets of <= %.0f MB", comm_->backend().c_str(),
                     grad_sync_->num_buckets(), cfg.dist.bucket_mb));
    }
    step_ = std::make_unique<ForwardBackward>(ForwardBackward::Parts{
        &cfg_, m_.model, m_.flat.get(), loader_.get(), source_tokens_.get(), comm_.get(), grad_sync_.get(), device_, world_, vocab_});
    profiler_ = std::make_unique<StepProfiler>(cfg.log.profile_steps, cfg.run.dir, rank_);
    deferred_ = m_.opt->fused() && world_ == 1 &&
                (cfg.anomaly.action == "continue" || (cfg.anomaly.action == "skip" && cfg.anomaly.spike_factor <= 0));
    if (deferred_) log::info("step results read one step late: the device skips non-finite steps, no spike skips");
    const GpuInfo gpu = gpu_info(device_);
    if (device_.is_cuda()) at::globalContext().setFloat32MatmulPrecision("high");  // TF32 for fp32 matmuls
    telemetry_.start(command, {"", nlohmann::json::parse(to_json(cfg_)), data_, describe_mixture(cfg_.data, data_), gpu,
                               world_, launch_.source, m_.params, m_.flops_per_token},
                     resume_.dir.empty() ? -1 : progress_.step);
    if (device_.is_cuda()) nvidia_smi_snapshot(cfg_.run.dir, "start", rank_);
    ckpt_->prepare(state_.snapshot(progress_.step, {}));  // async saves: the staging buffer, before the first
    stop_signal::training_started();  // meta.json exists: from here a stop signal checkpoints
  }

  TrainSummary run() {
    const auto t_start = Clock::now();
    std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit fails the write (EFBIG) instead of killing us
    std::vector<data::Batch> batches(static_cast<size_t>(cfg_.train.grad_accum));
    m_.model->train();
    while (progress_.step < cfg_.train.max_steps) {
      try {
        if (!train_step(batches)) return summary(t_start);
      } catch (const RemoteError&) {  // the data stayed out of reach: checkpoint the last whole step
        if (auto prev = std::move(pending_)) read_step(*prev, prev->kept);
        loader_->rewind_to(step_->batches_before());
        save_and_wait();
        throw;
      }
    }
    if (eval_) evaluate();
    if (ckpt_->last_save_step() != progress_.step) save();  // always one at the end
    ckpt_->wait();
    telemetry_.flush();
    log_saves();
    if (rank_ == 0)
      save_safetensors(run_dir::weights(cfg_.run.dir), module_tensors(*m_.model),
                       {{"format", "pt"}, {"arch", cfg_.model.arch}, {"step", std::to_string(progress_.step)}});
    return summary(t_start);
  }

  // After run() or a failure: meta.json's final status, a GPU snapshot on failure.
  void finish(int exit_code, const std::string& error) {
    if (!error.empty() && device_.is_cuda()) nvidia_smi_snapshot(cfg_.run.dir, "failure", rank_);
    telemetry_.finish(!error.empty() ? "failed" : stopped_ ? "stopped" : "completed", exit_code, error);
  }

 private:
  // ---- setup (in this order) ------------------------------------------------------------------
  void open_data() {
    data_ = data::open_train_data(cfg_.data);
    source_tokens_ = std::make_unique<SourceTokens>(data_.names);
    data_vocab_ = data_.vocab_size();
    if (cfg_.model.vocab_size > 0 && cfg_.model.vocab_size < data_vocab_)
      throw ConfigError("key 'model.vocab_size': " + std::to_string(cfg_.model.vocab_size) +
                        " is smaller than the data's vocabulary (" + std::to_string(data_vocab_) + ")");
    loader_ = std::make_unique<data::Loader>(cfg_.data, data_.sources, "train", cfg_.model.seq_len,
                                             cfg_.train.micro_batch_size, rank_, world_,
                                             static_cast<uint64_t>(cfg_.run.seed), cfg_.train.grad_accum);
    progress_.loader = loader_.get();
    eval_ = Evaluator::create(cfg_, data_.val_source(), device_, rank_, world_);
    vocab_ = padded_vocab(cfg_.model, data_vocab_);
    if (cfg_.train.bf16() && !device_.is_cuda() && !compat::kHasCpuAutocast)
      throw ConfigError("key 'train.dtype': bf16 autocast on the CPU needs LibTorch >= 2.4 (this is " +
                        compat::torch_version() + "; train.device=" + cfg_.train.device + ")");
  }

  // The run directory, this rank's log, and the process group.
  void open_run_dir() {
    const auto& dir = cfg_.run.dir;
    files::make_dirs(dir);
    // One trainer (group) per run directory: a second one would interleave metrics and checkpoints.
    if (rank_ == 0) lock_ = std::make_unique<DirLock>(dir, run_dir::kLock, "another trainer");
    files::make_dirs(run_dir::logs(dir));
    log::init(run_dir::rank_log(dir, rank_), /*console=*/rank_ == 0, rank_, world_);
    comm_ = open_process_group(launch_, cfg_.dist, device_, run_dir::logs(dir));
  }

  void build_model() {
    install_caching_host_allocator();
    set_intra_op_threads(cfg_.train.threads, device_);
    m_ = build_model_parts(cfg_, vocab_, data_vocab_, device_, rng_, rank_);
    log::info(strf("data: %s, %llu train tokens, data version %s, tokenizer %s, %s mode, %lld samples/epoch",
                   data_.sources[0].dir.c_str(), (unsigned long long)data_.sources[0].split_tokens("train"),
                   data_.sources[0].data_version.c_str(), data_.tokenizer().kind.c_str(), cfg_.data.mode.c_str(),
                   (long long)loader_->samples_per_epoch()));
    log::info(strf("device: %s, LibTorch %s, %d threads, world size %d", device_.str().c_str(),
                   compat::torch_version().c_str(), torch::get_num_threads(), world_));
  }

  // Every stateful component under its fixed key (trainer/checkpoint/state.h); the optimizer and
  // the EMA ask the checkpointer before they write what a snapshot may still be copying.
  void register_state() {
    using S = StateRegistry::Scope;
    namespace k = state_key;
    model_state_ = std::make_unique<ModuleState>(*m_.model, resume_.dir + "/model.safetensors");
    loader_position_.loader = loader_.get(), loader_position_.force = cfg_.checkpoint.force;
    m_.opt->set_fence(ckpt_.get());
    state_.add(k::kModel, S::kReplicated, *model_state_);
    state_.add(k::kOptimizer, S::kReplicated, *m_.opt);
    if (m_.ema) {
      m_.ema->set_fence(ckpt_.get());
      state_.add(k::kEma, S::kReplicated, *m_.ema, /*optional=*/true);
    }
    state_.add(k::kScheduler, S::kReplicated, schedule_);
    state_.add(k::kProgress, S::kReplicated, progress_);
    state_.add(k::kMetrics, S::kReplicated, telemetry_.train_log());
    state_.add(k::kAnomaly, S::kReplicated, detector_);
    state_.add(k::kLongWindow, S::kReplicated, telemetry_.long_window(), /*optional=*/true);
    state_.add(k::kLoader, S::kPerRank, loader_position_);
    state_.add(k::kSourceTokens, S::kReplicated, *source_tokens_, /*optional=*/true);
    state_.add(k::kRng, S::kOwnRank, rng_);
  }

  void restore() {
    const auto t0 = Clock::now();
    state_.restore(resume_.state, resume_.dir);
    load_ms_ = 1e3 * seconds_since(t0);
    log::info(strf("resumed from %s at step %lld (%.0f ms)", resume_.dir.c_str(), (long long)progress_.step, load_ms_));
  }

  // ---- one optimizer step ---------------------------------------------------------------------
  // One step's results as the host reads them: at once, or one step late where deferred_.
  struct StepResult {
    int64_t step = 0;  // 1-based
    RankStats mine;
    HostScalars stats;  // [loss sum, grad norm]
    double lr = 0, seconds = -1;  // seconds: set when the step is left pending
    Clock::time_point t0 = Clock::now();
    std::vector<data::Batch> kept;  // the batches, kept for anomaly evidence while pending
  };

  // Runs one step; false when a stop signal ended the run (checkpoint saved). Where deferred_ the
  // update is gated on the device (found_inf: a non-finite loss or grad norm) and the host reads a
  // step's results one step late; steps that log, evaluate, save or stop are read at once.
  bool train_step(std::vector<data::Batch>& batches) {
    profiler_->before_step(progress_.step);
    auto s = std::make_unique<StepResult>();
    torch::Tensor stats;
    s->mine = step_->run(batches, progress_.step, &stats);
    s->step = progress_.step + 1, s->lr = schedule_.at(progress_.step);
    if (deferred_) {  // the update and the EMA gated on the device: nothing waits for the host
      const auto found_inf = stats.isfinite().all().logical_not().to(torch::kFloat);
      m_.opt->step(s->lr, found_inf);
      if (m_.ema) m_.ema->update(found_inf);
    }
    s->stats = HostScalars(stats, /*wait=*/!deferred_);  // read at once: the step time includes the device's
    if (auto prev = std::move(pending_)) read_step(*prev, prev->kept);  // done, or nearly, by now
    s->mine.stop = stop_signal::requested() != 0;
    const double step_s_local = seconds_since(s->t0);
    mean_step_s_ = mean_step_s_ == 0 ? step_s_local : 0.9 * mean_step_s_ + 0.1 * step_s_local;
    s->mine.save = s->step != cfg_.train.max_steps && ckpt_->due(s->step, mean_step_s_);
    const int64_t n = s->step, every_eval = eval_ ? cfg_.eval.every_steps : 0;
    if (deferred_ && !s->mine.stop && !s->mine.save && n % cfg_.log.every_steps != 0 &&
        n != cfg_.train.max_steps && (every_eval <= 0 || n % every_eval != 0)) {
      profiler_->after_step(++progress_.step);
      s->seconds = seconds_since(s->t0), s->kept = batches;
      pending_ = std::move(s);
      return true;
    }
    const auto [anomaly, all] = read_step(*s, batches);
    return after_step(anomaly, all);
  }

  // The host half of a step: global statistics, the anomaly check, the optimizer step (unless
  // deferred_: already queued, gated on the device) and the records. Returns {anomaly, stats}.
  std::pair<std::string, GlobalStats> read_step(StepResult& s, const std::vector<data::Batch>& batches) {
    const std::vector<double> v = s.stats.get();
    s.mine.loss_sum = v[0];
    const double gnorm = v[1];
    const GlobalStats all = gather_step_stats(s.mine, comm_.get(), world_, s.step - 1);
    batch_hash_ = all.batch_hash;
    // Every rank sees the same global loss and grad norm, so they take the same decision.
    const std::string anomaly = detector_.check(s.step, all.loss, gnorm);
    if (!anomaly.empty()) {
      const auto& recent = detector_.recent_losses();
      telemetry_.anomaly({s.step, anomaly, cfg_.anomaly.action, all.loss, gnorm, s.lr, world_, batch_hash_,
                          {recent.begin(), recent.end()}, {}}, batches, data_.sources);
    }
    if (!deferred_ && (anomaly.empty() || (cfg_.anomaly.action == "continue" && std::isfinite(all.loss) && std::isfinite(gnorm)))) {
      m_.opt->step(s.lr);
      if (m_.ema) m_.ema->update();
    }
    if (progress_.step < s.step) profiler_->after_step(++progress_.step);  // read at once: counted here
    record_step(s.step, all, s.seconds >= 0 ? s.seconds : seconds_since(s.t0), s.lr, gnorm, s.mine.flops);
    return {anomaly, all};
  }

  // The step's totals into the training log; a "train" record every log.every_steps steps.
  void record_step(int64_t step, const GlobalStats& all, double step_s, double lr, double gnorm, double flops) {
    progress_.tokens += all.targets;
    ckpt_->step_done(step_s);  // measures an in-flight save's real stall
    telemetry_.add_step({all.loss, step_s, all.wait_max_ms, all.targets, all.pad, all.inputs, flops,
                         step > progress_.start_step + 1});
    if (step == progress_.start_step + 1 && !resume_.dir.empty()) telemetry_.resume_record(step, resume_.dir, load_ms_);
    if (step % cfg_.log.every_steps == 0 || step == cfg_.train.max_steps)
      telemetry_.train_record({progress_.step, lr, gnorm, progress_.tokens, progress_.epoch(), batch_hash_}, *source_tokens_);
  }

  // Validation, checkpoints and stops after a step; false when the run stops here.
  bool after_step(const std::string& anomaly, const GlobalStats& all) {
    const int64_t step = progress_.step;
    if (eval_ && cfg_.eval.every_steps > 0 && step % cfg_.eval.every_steps == 0 && step != cfg_.train.max_steps)
      evaluate();
    log_saves();
    if (!anomaly.empty() && cfg_.anomaly.action == "stop") {
      save_and_wait();
      throw Error(strf("stopped at step %lld by an anomaly (%s); evidence in %s, checkpoint saved", (long long)step,
                       anomaly.c_str(), run_dir::anomalies(cfg_.run.dir).c_str()));
    }
    if (all.stop) {
      log::warn(strf("stop signal: checkpointing at step %lld and exiting", (long long)step));
      save_and_wait();
      stopped_ = true;
      return false;
    }
    if (all.save) save();
    return true;
  }

  // The validation loss (and, with EMA, the EMA weights' loss: swapped in, fenced by the EMA).
  void evaluate() {
    const double loss = eval_->mean_loss(m_.model, comm_.get());
    const double ema_loss = m_.ema ? m_.ema->with_weights([&] { return eval_->mean_loss(m_.model, comm_.get()); }) : std::nan("");
    val_loss_ = loss;
    telemetry_.val_record(progress_.step, eval_->dir(), eval_->split(), loss, ema_loss);
  }

  // ---- checkpoints ----------------------------------------------------------------------------
  void save() {
    const nlohmann::json run = {{"config", to_yaml(cfg_)}, {"arch", arch_json(cfg_.model, vocab_)},
                                {"data_version", data_.version},
                                {"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}}};
    ckpt_->save(state_.snapshot(progress_.step, run));
    log_saves();
  }
  void save_and_wait() { save(), ckpt_->wait(), log_saves(); }

  // Errors of the background writers (checkpoint writer, metrics sink) arrive here, on the training
  // thread: checkpoint.on_error stop ends the run (one line, exit 1), continue warns.
  void log_saves() {
    auto failed = [&](const std::string& err) {
      if (cfg_.checkpoint.on_error == "stop") throw Error(err);
      log::warn(err + " (checkpoint.on_error: continue, training goes on)");
    };
    if (auto err = telemetry_.take_error(); !err.empty()) failed(err);
    for (auto& r : ckpt_->finished()) {
      if (!r.error.empty()) failed("checkpoint at step " + std::to_string(r.step) + " failed: " + r.error);
      else telemetry_.save_record({r.step, r.dir, r.async, r.block_ms, r.write_ms, r.mb, r.steal_ms});
    }
  }

  TrainSummary summary(Clock::time_point t_start) {
    return telemetry_.summary(progress_.step, progress_.start_step, seconds_since(t_start), val_loss_);
  }

  std::unique_ptr<DirLock> lock_;  // RUN_DIR/run.lock (rank 0); first member: released last
  ExperimentConfig cfg_;
  LaunchEnv launch_;
  torch::Device device_;
  int rank_ = 0, world_ = 1;
  // Data.
  data::TrainData data_;
  std::unique_ptr<SourceTokens> source_tokens_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<Evaluator> eval_;
  int64_t data_vocab_ = 0, vocab_ = 0;
  ModelParts m_;  // model, flat parameters, AdamW, EMA
  RngStreams rng_;
  AnomalyDetector detector_;
  Progress progress_;
  LrSchedule schedule_;
  std::unique_ptr<ModuleState> model_state_;
  LoaderPosition loader_position_;
  StateRegistry state_;
  // Distributed, checkpoints, telemetry.
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<GradSync> grad_sync_;
  std::unique_ptr<Checkpointer> ckpt_;
  ResumePoint resume_;
  RunTelemetry telemetry_;
  std::unique_ptr<StepProfiler> profiler_;
  // The step in flight.
  std::unique_ptr<ForwardBackward> step_;  // the step's device work
  uint64_t batch_hash_ = 0;
  double mean_step_s_ = 0, val_loss_ = -1, load_ms_ = 0;
  bool stopped_ = false;
  bool deferred_ = false;                // read step results one step late (see train_step)
  std::unique_ptr<StepResult> pending_;  // deferred_: the queued step not yet read
};

}  // namespace

TrainSummary train(const ExperimentConfig& cfg, const std::string& command) {
  stop_signal::install();  // start-up: a signal exits at once (stop_signal.h)
  Trainer t(cfg, command);  // bad input throws before anything is written
  try {
    auto sum = t.run();
    t.finish(kExitOk, "");
    return sum;
  } catch (const Error& e) {
    t.finish(e.exit_code(), e.what());
    throw;
  } catch (const std::exception& e) {
    t.finish(kExitFailure, e.what());
    throw;
  }
}

}  // namespace lm
