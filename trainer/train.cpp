// The training loop (see train.h): the Trainer composes the components and runs the steps. Each
// component owns its config, its state (common/torch/stateful.h, bound to a fixed key in
// register_state) and its records; the loop below reads top to bottom as the step it runs.
#include "trainer/train.h"

#include <torch/torch.h>

#include <cmath>
#include <csignal>
#include <cstdlib>
#include <memory>
#include <vector>

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
#include "trainer/hf/hf_dir.h"
#include "trainer/checkpoint/state.h"
#include "trainer/comm/launch_env.h"
#include "trainer/parallel/parallel.h"
#include "trainer/parallel/step_stats.h"
#include "trainer/eval/evaluate.h"
#include "trainer/parallel/memory_check.h"
#include "trainer/parallel/model_parts.h"
#include "trainer/optim/ema.h"
#include "trainer/optim/schedule.h"
#include "trainer/checkpoint/resume.h"
#include "run/run_dir.h"
#include "trainer/runtime/device.h"
#include "trainer/runtime/host_allocator.h"
#include "trainer/runtime/rng.h"
#include "trainer/step/step.h"
#include "trainer/eval/task_eval.h"
#include "trainer/runtime/stop_signal.h"
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
  ComponentState state() const override { return {loader->state().to_value(), {}}; }
  void load_state(const ComponentState* s) override { loader->load_state(data::LoaderState::from_value(s->values), force); }
};

class Trainer {
 public:
  // Every input is checked before anything is printed or written (a refusal prints one line and
  // leaves the run directory as it was: config.yaml, checkpoints and quarantine); the log is held
  // back meanwhile (train()).
  Trainer(const ExperimentConfig& cfg, const std::string& command)
      : cfg_(cfg),
        launch_(LaunchEnv::from_environment()),
        device_(pick_device(cfg.train.device, cfg.train.bf16(), launch_.local_rank)),
        rank_(launch_.rank), world_(launch_.world_size), rng_(device_),
        schedule_(cfg.schedule, cfg.optim.lr, cfg.train.max_steps, &progress_.step),
        telemetry_(cfg.log, cfg.anomaly, {cfg.run.dir, cfg.train.max_steps, cfg.train.dtype, cfg.optim.z_loss > 0,
                                          cfg.data.bucketed(), rank_, world_, device_}) {
    open_data();
    check_memory_fits(cfg, vocab_, device_, world_);  // before anything is allocated or written
    open_run_dir();
    checkpointer_ = std::make_unique<Checkpointer>(cfg.checkpoint, cfg.run.dir, rank_, world_,
                                           std::max(1, world_ / std::max(1, launch_.local_world_size)));
    resume_ = find_resume(*checkpointer_, cfg.checkpoint, comm_.get(), rank_);
    if (!resume_.dir.empty())
      check_compatible(resume_, arch_json(cfg.model, vocab_), data_.resume_version, cfg.checkpoint.force);
    const double mb_before_model = memory_mb(device_);
    build_model();
    register_state();
    ResumeFacts resumed;
    if (!resume_.dir.empty()) resumed = restore();
    check_data_lasts();
    // Everything checked: from here on the run prints and writes.
    log::release();
    if (rank_ == 0) {
      log::info("trainer: " + command);
      log::info("resolved config (* = not the default):\n" + to_table(cfg));
      checkpointer_->quarantine_pending();
      files::write_file_atomic(run_dir::config(cfg.run.dir), to_yaml(cfg));
      data_.save_tokenizer(run_dir::tokenizer(cfg.run.dir));
    }
    log::info(data_.describe() + strf(", %s mode, %lld samples/epoch", cfg_.data.mode.c_str(),
                                      (long long)loader_->samples_per_epoch()));
    log::info(describe_runtime(device_, world_));
    if (!resume_.dir.empty())
      log::info(strf("resumed from %s at step %lld (%.0f ms)", resume_.dir.c_str(), (long long)progress_.step, resumed.load_ms));
    model_parts_.parallel->start();
    log::info(model_parts_.parallel->describe(model_parts_.opt->state_bytes(), model_parts_.opt->state_name()));
    // The start's own peak: the model built, placed and restored (ZeRO-3: never every weight at once).
    log::info(strf("memory: start-up peak %.0f MB (%s), %.0f MB before the model; the weights are %.0f MB",
                   peak_memory_mb(device_), device_.is_cuda() ? "CUDA peak allocated" : "peak resident set",
                   mb_before_model, 4.0 * static_cast<double>(model_parts_.params) / 1e6));
    ForwardBackward::Parts step;
    step.config = {&cfg_.train, &cfg_.model, cfg_.data.reuse_batch, !cfg_.data.bucketed(), cfg_.optim.grad_clip,
                   cfg_.optim.z_loss > 0};
    step.model = {model_parts_.model, model_parts_.flat.get(), model_parts_.parallel.get()};
    step.data = {loader_.get(), source_tokens_.get()};
    step.runtime = {comm_.get(), device_, world_, vocab_};
    forward_backward_ = std::make_unique<ForwardBackward>(step);
    step_update_ = std::make_unique<StepUpdate>(cfg.anomaly, *model_parts_.opt, model_parts_.ema.get(), world_, *model_parts_.parallel);
    profiler_ = std::make_unique<StepProfiler>(cfg.log.profile_steps, cfg.run.dir, rank_, device_);
    telemetry_.start(command, {"", nlohmann::json::parse(to_json(cfg_)), data_,
                               gpu_info(device_), world_, launch_.source, model_parts_.params, model_parts_.flops_per_token,
                               schedule_.record(), model_parts_.parallel->record()}, resumed);
    if (device_.is_cuda()) nvidia_smi_snapshot(cfg_.run.dir, "start", rank_);
    checkpointer_->prepare(state_.snapshot(progress_.step, {}));  // async saves: the staging buffer, before the first
    stop_signal::training_started();  // meta.json exists: from here a stop signal checkpoints
  }

  TrainSummary run() {
    const auto t_start = Clock::now();
    std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit fails the write (EFBIG) instead of killing us
    std::vector<data::Batch> batches(static_cast<size_t>(cfg_.train.grad_accum));
    model_parts_.model->train();
    if (task_eval_) score_tasks();  // the untrained (or resumed) model's scores, before its first step
    while (progress_.step < cfg_.train.max_steps) {
      try {
        if (!train_step(batches)) return telemetry_.summary(progress_.step, progress_.start_step, seconds_since(t_start));
      } catch (const RemoteError&) {  // the data stayed out of reach: checkpoint the last whole step
        keep_last_whole_step();
        throw;
      } catch (const DataError& e) {  // the data ended or went bad (a 4xx): the last whole step, and its weights
        keep_last_whole_step();
        if (progress_.step == progress_.start_step) throw;  // nothing new to keep
        model_parts_.save_weights(run_dir::weights(cfg_.run.dir), cfg_.model.arch, progress_.step, rank_);
        throw DataError(strf("%s; stopped after step %lld: its checkpoint and %s saved", e.what(),
                             (long long)progress_.step, run_dir::weights(cfg_.run.dir).c_str()));
      }
    }
    evaluate();
    if (checkpointer_->last_save_step() != progress_.step) save();  // always one at the end
    checkpointer_->wait();
    telemetry_.flush();
    log_saves();
    model_parts_.save_weights(run_dir::weights(cfg_.run.dir), cfg_.model.arch, progress_.step, rank_);
    return telemetry_.summary(progress_.step, progress_.start_step, seconds_since(t_start));
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
    vocab_ = padded_vocab(cfg_.model, data_.vocab_size());
    loader_ = std::make_unique<data::Loader>(cfg_.data, data_.sources, "train", cfg_.model.seq_len,
                                             cfg_.train.micro_batch_size, rank_, world_,
                                             static_cast<uint64_t>(cfg_.run.seed), cfg_.train.grad_accum,
                                             /*step_blocks=*/cfg_.dist.invariant);
    progress_.loader = loader_.get();
    const EvalRuntime eval_rt{cfg_.model.seq_len, cfg_.train.micro_batch_size, device_, cfg_.train.bf16(), rank_, world_};
    validation_ = Evaluator::create(cfg_.eval, cfg_.data, data_.val_source(), eval_rt);
    if (!cfg_.eval.tasks.empty())  // a bad task file is refused here, before anything is written
      task_eval_ = TaskEvaluator::create(cfg_.eval, *load_run_tokenizer(data_), eval_rt);
  }

  // The run directory, this rank's log, and the process group.
  void open_run_dir() {
    const auto& dir = cfg_.run.dir;
    files::make_dirs(dir);
    // One trainer (group) per run directory: a second one would interleave metrics and checkpoints.
    if (rank_ == 0) lock_ = std::make_unique<DirLock>(dir, run_dir::kLock, "another trainer");
    files::make_dirs(run_dir::logs(dir));
    log::init(run_dir::rank_log(dir, rank_), /*console=*/rank_ == 0, rank_, world_);
    // A rendezvous may wait long for the other ranks: what it waits for shows from here on (a refused
    // distributed start may print the start-up lines before its one).
    if (world_ > 1) log::release();
    comm_ = open_process_group(launch_, cfg_.dist, device_, run_dir::logs(dir));
  }

  void build_model() {
    install_caching_host_allocator();
    configure_math(cfg_.train.threads, device_, cfg_.dist.invariant);
    model_parts_ = build_model_parts(cfg_, vocab_, data_.vocab_size(), static_cast<int64_t>(data_.tokenizer().eos_id), device_, rng_,
                           comm_.get(), rank_, world_);
  }

  // Every stateful component under its fixed key (trainer/checkpoint/state.h); the optimizer and
  // the EMA ask the checkpointer before they write what a snapshot may still be copying.
  void register_state() {
    using S = StateRegistry::Scope;
    namespace k = state_key;
    loader_position_.loader = loader_.get(), loader_position_.force = cfg_.checkpoint.force;
    model_parts_.set_fence(checkpointer_.get());
    model_parts_.register_state(state_, resume_.dir);  // model, optimizer, EMA, the parallelism's (model_parts.h)
    state_.add(k::kScheduler, S::kReplicated, schedule_);
    state_.add(k::kProgress, S::kReplicated, progress_);
    state_.add(k::kMetrics, S::kReplicated, telemetry_.train_log());
    state_.add(k::kAnomaly, S::kReplicated, telemetry_.detector());
    state_.add(k::kLongWindow, S::kReplicated, telemetry_.long_window(), /*optional=*/true);
    state_.add(k::kLoader, S::kPerRank, loader_position_);
    state_.add(k::kSourceTokens, S::kReplicated, *source_tokens_, /*optional=*/true);
    state_.add(k::kRng, S::kOwnRank, rng_);
  }

  ResumeFacts restore() {
    const auto t0 = Clock::now();
    state_.restore(resume_.state, resume_.dir);
    return {progress_.step, resume_.dir, 1e3 * seconds_since(t0)};
  }

  // Refuses (DataError, exit 2) a run whose data the plan shows to end before train.max_steps:
  // every source with a weight capped by max_epochs (loader.h, batches_left).
  void check_data_lasts() {
    const int64_t accum = cfg_.train.grad_accum, steps = cfg_.train.max_steps - progress_.step;
    if (steps <= 0) return;
    const uint64_t need = static_cast<uint64_t>(cfg_.data.reuse_batch ? accum : steps * accum);
    const uint64_t left = loader_->batches_left(need, cfg_.checkpoint.force);
    if (left >= need) return;
    const int64_t last = progress_.step + static_cast<int64_t>(left) / accum;
    throw DataError(strf("train.max_steps=%lld cannot be reached: the data ends after step %lld (batch %llu: every "
                         "source with a weight reaches its max_epochs); raise a source's max_epochs (data.sources), "
                         "or set train.max_steps=%lld",
                         (long long)cfg_.train.max_steps, (long long)last,
                         static_cast<unsigned long long>(loader_->state().batches + left), (long long)last));
  }

  // ---- one optimizer step ---------------------------------------------------------------------
  // Runs one step; false when a stop signal ended the run (checkpoint saved). Where the update is
  // deferred (StepUpdate) a quiet step's results are read one step late; steps that log,
  // evaluate, save or stop are read at once.
  bool train_step(std::vector<data::Batch>& batches) {
    profiler_->before_step(progress_.step);
    const auto t0 = Clock::now();
    torch::Tensor stats;
    reading_ = true;
    const RankStats mine = forward_backward_->run(batches, progress_.step, &stats);
    reading_ = false;
    auto s = step_update_->begin(progress_.step + 1, schedule_.at(progress_.step), mine, stats, t0);
    if (auto prev = step_update_->take()) read_step(*prev, prev->kept);  // done, or nearly, by now
    s->mine.stop = stop_signal::requested() != 0;
    const int64_t n = s->step;
    s->mine.save = n != cfg_.train.max_steps && checkpointer_->due(n, seconds_since(t0));
    if (step_update_->deferred() && !s->mine.stop && !s->mine.save && n % cfg_.log.every_steps != 0 &&
        n != cfg_.train.max_steps && !eval_due(n)) {
      profiler_->after_step(++progress_.step);
      step_update_->hold(std::move(s), batches);
      return true;
    }
    const auto [anomaly, all] = read_step(*s, batches);
    return after_step(anomaly, all);
  }

  // The host half of a step: global statistics, the anomaly check (every rank sees the same global
  // loss and grad norm, so they take the same decision), the update and the records.
  std::pair<std::string, GlobalStats> read_step(StepResult& s, const std::vector<data::Batch>& batches) {
    const std::vector<double> v = s.stats.get();
    s.mine.loss_sum = v[0];
    if (v.size() > 2) s.mine.z_loss_sum = v[2];
    const double gnorm = v[1];
    const GlobalStats all = gather_step_stats(s.mine, comm_.get(), world_, s.step - 1);
    const std::string anomaly = telemetry_.check_step({s.step, all.loss, gnorm, s.lr, all.batch_hash}, batches, data_.sources);
    step_update_->update(anomaly, all.loss, gnorm, s.lr);
    if (progress_.step < s.step) profiler_->after_step(++progress_.step);  // read at once: counted here
    progress_.tokens += all.targets;
    const double step_s = s.seconds >= 0 ? s.seconds : seconds_since(s.t0);
    checkpointer_->step_done(step_s);  // measures an in-flight save's real stall
    telemetry_.add_step({all.loss, all.z_loss, step_s, all.wait_max_ms, all.targets, all.pad, all.inputs, s.mine.flops,
                         s.step > progress_.start_step + 1});
    if (s.step % cfg_.log.every_steps == 0 || s.step == cfg_.train.max_steps)
      telemetry_.train_record({progress_.step, s.lr, gnorm, progress_.tokens, progress_.epoch(), all.batch_hash}, *source_tokens_);
    return {anomaly, all};
  }

  // Validation, checkpoints and stops after a step; false when the run stops here.
  bool after_step(const std::string& anomaly, const GlobalStats& all) {
    const int64_t step = progress_.step;
    if (eval_due(step)) evaluate();
    log_saves();
    if (!anomaly.empty() && cfg_.anomaly.stops()) {
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

  bool eval_due(int64_t step) const { return (validation_ || task_eval_) && cfg_.eval.due(step, cfg_.train.max_steps); }
  // The validation loss (and, with EMA, the EMA weights' loss: swapped in, fenced by the EMA), and
  // the downstream tasks' scores (the trained weights). Whatever the parallelism, the forwards read
  // the weights as the step's do (ZeRO-3 gathers them unit by unit inside them).
  void evaluate() {
    if (task_eval_) score_tasks();
    if (!validation_) return;
    const double loss = validation_->mean_loss(model_parts_.model, comm_.get());
    double ema_loss = std::nan("");
    if (model_parts_.ema) ema_loss = model_parts_.with_ema_weights([&] { return validation_->mean_loss(model_parts_.model, comm_.get()); });
    telemetry_.val_record(progress_.step, validation_->dir(), validation_->split(), loss, ema_loss);
  }

  void score_tasks() { telemetry_.task_record(progress_.step, task_eval_->score(model_parts_.model, comm_.get())); }

  // ---- checkpoints ----------------------------------------------------------------------------
  void save() {
    checkpointer_->save(state_.snapshot(progress_.step, run_facts(to_yaml(cfg_), cfg_.model, vocab_, data_.version)));
    log_saves();
  }
  void save_and_wait() { save(), checkpointer_->wait(), log_saves(); }
  // A step's data failed: the step before it (its deferred update read) checkpointed, unless saved
  // or loaded already, with the loader back at the failed step's first micro-batch.
  void keep_last_whole_step() {
    if (auto prev = step_update_->take()) read_step(*prev, prev->kept);
    if (reading_) loader_->rewind_to(forward_backward_->batches_before());  // (not when validation failed after a step)
    if (checkpointer_->last_save_step() != progress_.step) save();
    checkpointer_->wait();
    log_saves();
  }

  // Errors of the background writers (checkpoint writer, metrics sink) arrive here, on the training
  // thread (checkpoint.on_error decides); finished saves are recorded.
  void log_saves() {
    checkpointer_->report(telemetry_.take_error(), [&](const SaveReport& r) {
      telemetry_.save_record({r.step, r.dir, r.async, r.block_ms, r.write_ms, r.mb, r.steal_ms});
    });
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
  std::unique_ptr<Evaluator> validation_;
  std::unique_ptr<TaskEvaluator> task_eval_;  // eval.tasks
  int64_t vocab_ = 0;  // padded
  // Model and state.
  ModelParts model_parts_;  // model, flat parameters, parallelism, optimizer, EMA
  RngStreams rng_;
  Progress progress_;
  LrSchedule schedule_;
  LoaderPosition loader_position_;
  StateRegistry state_;
  // Distributed, checkpoints, telemetry.
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<Checkpointer> checkpointer_;
  ResumePoint resume_;
  RunTelemetry telemetry_;
  std::unique_ptr<StepProfiler> profiler_;
  // The step.
  std::unique_ptr<ForwardBackward> forward_backward_;  // its device work
  std::unique_ptr<StepUpdate> step_update_;     // its update, and the step left unread
  bool stopped_ = false;
  bool reading_ = false;  // the step's micro-batches are being read and computed
};

}  // namespace

TrainSummary train(const ExperimentConfig& cfg, const std::string& command) {
  stop_signal::install();  // start-up: a signal exits at once (stop_signal.h)
  std::unique_ptr<Trainer> trainer;
  log::hold();  // until every input is checked: a refusal is its one line, what failed otherwise gets its context
  try {
    trainer = std::make_unique<Trainer>(cfg, command);  // bad input throws before anything is written
  } catch (const Error& e) {
    e.exit_code() == kExitBadInput ? log::discard() : log::release();
    throw;
  } catch (...) {
    log::release();
    throw;
  }
  Trainer& t = *trainer;
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
