// The training loop (see train.h): the Trainer composes the components and runs the steps.
#include "trainer/train.h"

#include <torch/torch.h>

#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstdio>
#include <memory>
#include <vector>

#include "common/build_info.h"
#include "common/checksum.h"
#include "common/clock.h"
#include "common/compat.h"
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
#include "trainer/cli.h"
#include "trainer/stop_signal.h"
#include "trainer/dist/grad_sync.h"
#include "trainer/dist/launch_env.h"
#include "trainer/dist/step_stats.h"
#include "trainer/evaluate.h"
#include "trainer/memory_check.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/ema.h"
#include "trainer/optim/schedule.h"
#include "trainer/resume.h"
#include "trainer/run_dir.h"
#include "trainer/runtime/device.h"
#include "trainer/runtime/host_allocator.h"
#include "trainer/runtime/rng.h"
#include "trainer/telemetry/anomaly.h"
#include "trainer/telemetry/metrics.h"
#include "trainer/telemetry/profiler.h"
#include "trainer/telemetry/records.h"
#include "trainer/telemetry/run_record.h"
#include "trainer/telemetry/source_tokens.h"
#include "trainer/telemetry/train_log.h"

namespace lm {
namespace {

using Clock = clock::Steady;
using clock::seconds_since;
using clock::unix_now;

class Trainer {
 public:
  // Every input is checked before anything is printed or written.
  Trainer(const ExperimentConfig& cfg, const std::string& command)
      : cfg_(cfg), launch_(LaunchEnv::from_environment()), device_(pick_device(cfg.train.device, launch_.local_rank)),
        rank_(launch_.rank), world_(launch_.world_size), rng_(device_), detector_(cfg.anomaly),
        schedule_(cfg.schedule, cfg.optim.lr, cfg.train.max_steps) {
    open_data();
    check_memory_fits(cfg, vocab_, device_);  // before anything is allocated or written
    open_run_dir();
    ckpt_ = std::make_unique<Checkpointer>(cfg.checkpoint, cfg.run.dir, rank_, world_,
                                           std::max(1, world_ / std::max(1, launch_.local_world_size)));
    resume_ = find_resume(*ckpt_, cfg.checkpoint, comm_.get(), rank_);
    if (!resume_.dir.empty())  // a mixture's sources: checked one by one by the loader state (data/loader/mix.h)
      check_compatible(resume_, arch_json(cfg.model, vocab_), cfg.data.sources.empty() ? manifest_.data_version : "",
                       cfg.checkpoint.force);
    if (rank_ == 0) {
      log::info("trainer: " + command);
      log::info("resolved config (* = not the default):\n" + to_table(cfg));
      files::write_file_atomic(run_dir::config(cfg.run.dir), to_yaml(cfg));
    }
    build_model();
    register_state();
    if (!resume_.dir.empty()) restore();
    if (comm_) {
      comm_->broadcast(flat_->params(), 0, "broadcast of the initial parameters");
      grad_sync_ = std::make_unique<GradSync>(*comm_, *flat_, *model_, cfg.dist.bucket_mb);
      log::info(strf("data parallel: %s, %zu gradient buckets of <= %.0f MB", comm_->backend().c_str(),
                     grad_sync_->num_buckets(), cfg.dist.bucket_mb));
    }
    profiler_ = std::make_unique<StepProfiler>(cfg.log.profile_steps, cfg.run.dir, rank_);
    deferred_ = opt_->fused() && world_ == 1 &&
                (cfg.anomaly.action == "continue" || (cfg.anomaly.action == "skip" && cfg.anomaly.spike_factor <= 0));
    if (deferred_) log::info("step results read one step late: the device skips non-finite steps, no spike skips");
    start_telemetry(command);
    if (cfg.checkpoint.async) ckpt_->prepare(state_.snapshot(step_, {}));  // the staging buffer, before the first save
    stop_signal::training_started();  // meta.json exists: from here a stop signal checkpoints
  }

  TrainSummary run() {
    const auto t_start = Clock::now();
    std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit fails the write (EFBIG) instead of killing us
    std::vector<data::Batch> batches(static_cast<size_t>(cfg_.train.grad_accum));
    model_->train();
    while (step_ < cfg_.train.max_steps) {
      try {
        if (!train_step(batches)) return summary(t_start);
      } catch (const RemoteError&) {  // the data stayed out of reach: checkpoint the last whole step
        if (auto prev = std::move(pending_)) settle(*prev, prev->kept);
        loader_->rewind_to(step_batches_);
        save_and_wait();
        throw;
      }
    }
    if (eval_) evaluate();
    if (ckpt_->last_save_step() != step_) save();  // always one at the end
    ckpt_->wait();
    if (metrics_) metrics_->flush();
    log_saves();
    if (rank_ == 0)
      save_safetensors(run_dir::weights(cfg_.run.dir), module_tensors(*model_),
                       {{"format", "pt"}, {"arch", cfg_.model.arch}, {"step", std::to_string(step_)}});
    return summary(t_start);
  }

  // After run() or a failure: meta.json's final status, a GPU snapshot on failure.
  void finish(int exit_code, const std::string& error) {
    if (metrics_) metrics_->flush();
    if (!error.empty() && device_.is_cuda()) nvidia_smi_snapshot(cfg_.run.dir, "failure", rank_);
    try {
      if (record_) record_->finish(!error.empty() ? "failed" : stopped_ ? "stopped" : "completed", exit_code, error);
    } catch (const Error& e) {  // e.g. the disk that failed the run: its error is the one to report
      if (error.empty()) throw;
      log::debug(std::string("meta.json not updated: ") + e.what());
    }
  }

 private:
  // ---- setup (in this order) ------------------------------------------------------------------
  void open_data() {
    sources_ = data::open_sources(cfg_.data);
    manifest_ = sources_[0];
    source_tokens_ = std::make_unique<SourceTokens>(data::source_names(cfg_.data));
    data_vocab_ = static_cast<int64_t>(manifest_.tokenizer.vocab_size);
    if (cfg_.model.vocab_size > 0 && cfg_.model.vocab_size < data_vocab_)
      throw ConfigError("key 'model.vocab_size': " + std::to_string(cfg_.model.vocab_size) +
                        " is smaller than the data's vocabulary (" + std::to_string(data_vocab_) + ")");
    loader_ = data::open_loader(cfg_.data, sources_, "train", cfg_.model.seq_len, cfg_.train.micro_batch_size, rank_, world_,
                                static_cast<uint64_t>(cfg_.run.seed), cfg_.train.grad_accum);
    eval_ = Evaluator::create(cfg_, manifest_, device_, rank_, world_);
    vocab_ = padded_vocab(cfg_.model, data_vocab_);
    if (cfg_.train.dtype == "bf16" && !device_.is_cuda() && !compat::kHasCpuAutocast)
      throw ConfigError("key 'train.dtype': bf16 autocast on the CPU needs LibTorch >= 2.4 (this is " +
                        compat::torch_version() + "; train.device=" + cfg_.train.device + ")");
    bf16_ = cfg_.train.dtype == "bf16";
  }

  // The run directory, this rank's log, and the process group.
  void open_run_dir() {
    const auto& dir = cfg_.run.dir;
    files::make_dirs(dir);
    // One trainer (group) per run directory: a second one would interleave metrics and checkpoints.
    if (rank_ == 0) lock_ = std::make_unique<DirLock>(dir, run_dir::kLock, "another trainer");
    files::make_dirs(run_dir::logs(dir));
    log::init(run_dir::rank_log(dir, rank_), /*console=*/rank_ == 0, rank_, world_);
    // One rank has a process group only when dist.backend names one (the device check runs NCCL so).
    if (world_ <= 1 && cfg_.dist.backend == "auto") return;
    LaunchEnv env = launch_;
    if (world_ <= 1 && env.master_addr.empty()) env.master_addr = "127.0.0.1", env.master_port = 0;  // any free port
    log::info(strf("rank %d of %d (%s launch, local rank %d), rendezvous %s:%d", rank_, world_,
                   env.source.empty() ? "single-process" : env.source.c_str(), env.local_rank, env.master_addr.c_str(),
                   env.master_port));
    if (cfg_.dist.backend == "nccl" || (cfg_.dist.backend == "auto" && device_.is_cuda())) {
      // NCCL's own log, kept per rank with the run ("why did it break").
      ::setenv("NCCL_DEBUG", "INFO", /*overwrite=*/0);
      ::setenv("NCCL_DEBUG_FILE", (run_dir::logs(dir) + "/nccl_rank" + std::to_string(rank_) + ".%h.%p.log").c_str(), 0);
    }
    comm_ = std::make_unique<Comm>(env, cfg_.dist, device_);
  }

  void build_model() {
    install_caching_host_allocator();
    set_intra_op_threads(cfg_.train.threads, device_);
    const auto seed = static_cast<uint64_t>(cfg_.run.seed);
    rng_.seed_shared(seed);  // identical init on every rank
    model_ = lm::build_model(cfg_.model, vocab_);
    init_from_hf(*model_, cfg_.model.init_from);  // model.init_from, when set
    model_->to(device_);
    uploader_ = std::make_unique<BatchUploader>(device_);
    flat_ = std::make_unique<FlatParams>(*model_);
    opt_ = std::make_unique<AdamW>(*flat_, cfg_.optim);
    if (cfg_.train.ema_decay > 0) ema_ = std::make_unique<Ema>(*flat_, cfg_.train.ema_decay);
    rng_.seed_rank(seed, rank_);  // each rank's own dropout stream
    params_ = model_->num_params();
    flops_per_token_ = flops_per_token(cfg_.model, vocab_, cfg_.model.seq_len);
    log::info(strf("model: %s, %lld parameters (%.2fM), vocab %lld (data %lld), %.3g FLOPs/token at T=%lld (%s)",
                   cfg_.model.arch.c_str(), (long long)params_, params_ / 1e6, (long long)vocab_,
                   (long long)data_vocab_, flops_per_token_, (long long)cfg_.model.seq_len,
                   flops_formula(cfg_.model).c_str()));
    log::info(strf("data: %s, %llu train tokens, data version %s, tokenizer %s, %s mode, %lld samples/epoch",
                   manifest_.dir.c_str(), (unsigned long long)manifest_.split_tokens("train"),
                   manifest_.data_version.c_str(), manifest_.tokenizer.kind.c_str(), cfg_.data.mode.c_str(),
                   (long long)loader_->samples_per_epoch()));
    log::info(strf("device: %s, LibTorch %s, %d threads, world size %d", device_.str().c_str(),
                   compat::torch_version().c_str(), torch::get_num_threads(), world_));
  }

  // Every stateful component under its fixed key (trainer/checkpoint/state.h).
  void register_state() {
    using S = StateRegistry::Scope;
    namespace k = state_key;
    state_.add(k::kModel, S::kReplicated, [this] { return ComponentState{{}, module_tensors(*model_)}; },
               [this](const ComponentState* s) { load_into_module(*model_, s->tensors, resume_.dir + "/model.safetensors"); });
    state_.add(k::kOptimizer, S::kReplicated, [this] { return opt_->state(); },
               [this](const ComponentState* s) { opt_->load_state(*s); });
    if (ema_)
      state_.add(k::kEma, S::kReplicated, [this] { return ema_->state(); },
                 [this](const ComponentState* s) { ema_->load_state(s); }, /*optional=*/true);
    state_.add(k::kScheduler, S::kReplicated, [this] { return schedule_.state(step_); },
               [this](const ComponentState* s) { schedule_.load_state(*s); });
    state_.add(k::kProgress, S::kReplicated, [this] { return progress_state(); },
               [this](const ComponentState* s) { load_progress(*s); });
    state_.add(k::kMetrics, S::kReplicated, [this] { return train_log_.state(); },
               [this](const ComponentState* s) { train_log_.load_state(*s); });
    state_.add(k::kAnomaly, S::kReplicated, [this] { return detector_.state(); },
               [this](const ComponentState* s) { detector_.load_state(*s); });
    state_.add(k::kLongWindow, S::kReplicated,
               [this] { return ComponentState{metrics_ ? metrics_->window_state() : nlohmann::json::object(), {}}; },
               [this](const ComponentState* s) { long_window_ = s ? s->values : nlohmann::json(); }, /*optional=*/true);
    state_.add(k::kLoader, S::kPerRank, [this] { return ComponentState{nlohmann::json::parse(loader_->state().to_json()), {}}; },
               [this](const ComponentState* s) { load_loader(*s); });
    state_.add(k::kSourceTokens, S::kReplicated, [this] { return source_tokens_->state(); },
               [this](const ComponentState* s) { source_tokens_->load_state(s); }, true);
    state_.add(k::kRng, S::kPerRank, [this] { return rng_.state(); }, [this](const ComponentState* s) { load_rng(*s); });
  }

  ComponentState progress_state() const { return {{{"step", step_}, {"tokens", tokens_}, {"epoch", epoch()}}, {}}; }
  void load_progress(const ComponentState& s) {
    step_ = start_step_ = s.values.at("step").get<int64_t>();
    tokens_ = s.values.at("tokens").get<int64_t>();
  }
  void load_loader(const ComponentState& s) {
    if (!cfg_.data.sources.empty() || resume_.state.run.at("data_version") == manifest_.data_version)  // a mixture: checked by source
      loader_->load_state(data::LoaderState::from_json(s.values.dump()), cfg_.checkpoint.force);
    else
      log::warn("other data than the checkpoint's (checkpoint.force): the data order starts from the beginning");
  }
  void load_rng(const ComponentState& s) {
    if (resume_.state.saved_rank == rank_) return rng_.load_state(s);
    log::warn(strf("%s has no state for rank %d (world size changed): the global data cursor is "
                   "rank 0's, dropout draws start anew", resume_.dir.c_str(), rank_));
  }

  void restore() {
    const auto t0 = Clock::now();
    state_.restore(resume_.state, resume_.dir);
    load_ms_ = 1e3 * seconds_since(t0);
    log::info(strf("resumed from %s at step %lld (%.0f ms)", resume_.dir.c_str(), (long long)step_, load_ms_));
  }

  // MFU peak, metrics sink and meta.json (rank 0), the GPU snapshot.
  void start_telemetry(const std::string& command) {
    const GpuInfo gpu = gpu_info(device_);
    if (device_.is_cuda()) at::globalContext().setFloat32MatmulPrecision("high");  // TF32 for fp32 matmuls
    peak_ = mfu_peak(cfg_.log.peak_tflops, gpu.model, cfg_.train.dtype, device_);
    log::info(peak_.flops <= 0 ? "MFU unknown: no peak for " + gpu.model + " (set log.peak_tflops)"
                               : strf("MFU against %.4g TFLOP/s (%s): matmul FLOPs of the non-pad tokens (models/gpt.h) "
                                      "over the steps' wall time (data wait, upload, forward, backward, all-reduce, "
                                      "clipping, optimizer and EMA; not validation, checkpoint saves or logging)",
                                      peak_.flops / 1e12, peak_.source.c_str()));
    if (rank_ == 0) {
      MetricsSink::Options mo;
      mo.run_dir = cfg_.run.dir;
      mo.keep_through_step = resume_.dir.empty() ? -1 : step_;
      mo.tensorboard = cfg_.log.tensorboard;
      mo.total_steps = cfg_.train.max_steps;
      mo.long_window_s = cfg_.log.long_window_s;
      metrics_ = std::make_unique<MetricsSink>(mo);
      if (long_window_.is_object() && !long_window_.empty()) metrics_->load_window_state(long_window_);
      record_ = std::make_unique<RunRecord>(cfg_.run.dir, describe_run({command, nlohmann::json::parse(to_json(cfg_)),
                                                                        sources_, describe_mixture(cfg_.data, sources_), gpu,
                                                                        world_, launch_.source, params_, flops_per_token_}));
    }
    if (device_.is_cuda()) nvidia_smi_snapshot(cfg_.run.dir, "start", rank_);
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
    profiler_->before_step(step_);
    auto s = std::make_unique<StepResult>();
    torch::Tensor stats;
    s->mine = forward_backward(batches, &stats);
    s->step = step_ + 1, s->lr = schedule_.at(step_);
    if (deferred_) {  // the update and the EMA gated on the device: nothing waits for the host
      ckpt_->wait_snapshot();
      const auto found_inf = stats.isfinite().all().logical_not().to(torch::kFloat);
      opt_->step(s->lr, found_inf);
      if (ema_) ema_->update(found_inf);
    }
    s->stats = HostScalars(stats, /*wait=*/!deferred_);  // read at once: the step time includes the device's
    if (auto prev = std::move(pending_)) settle(*prev, prev->kept);  // done, or nearly, by now
    s->mine.stop = stop_signal::requested() != 0;
    const double step_s_local = seconds_since(s->t0);
    mean_step_s_ = mean_step_s_ == 0 ? step_s_local : 0.9 * mean_step_s_ + 0.1 * step_s_local;
    s->mine.save = s->step != cfg_.train.max_steps && ckpt_->due(s->step, mean_step_s_);
    const int64_t n = s->step, every_eval = eval_ ? cfg_.eval.every_steps : 0;
    if (deferred_ && !s->mine.stop && !s->mine.save && n % cfg_.log.every_steps != 0 &&
        n != cfg_.train.max_steps && (every_eval <= 0 || n % every_eval != 0)) {
      profiler_->after_step(++step_);
      s->seconds = seconds_since(s->t0), s->kept = batches;
      pending_ = std::move(s);
      return true;
    }
    const auto [anomaly, all] = settle(*s, batches);
    return after_step(anomaly, all);
  }

  // The host half of a step: global statistics, the anomaly check, the optimizer step (unless
  // deferred_: already queued, gated on the device) and the records. Returns {anomaly, stats}.
  std::pair<std::string, GlobalStats> settle(StepResult& s, const std::vector<data::Batch>& batches) {
    const std::vector<double> v = s.stats.get();
    s.mine.loss_sum = v[0];
    const double gnorm = v[1];
    const GlobalStats all = gather_step_stats(s.mine, comm_.get(), world_, s.step - 1);
    batch_hash_ = all.batch_hash;
    // Every rank sees the same global loss and grad norm, so they take the same decision.
    const std::string anomaly = detector_.check(s.step, all.loss, gnorm);
    if (!anomaly.empty()) record_anomaly(s.step, anomaly, all.loss, gnorm, s.lr, batches);
    if (!deferred_ && (anomaly.empty() || (cfg_.anomaly.action == "continue" && std::isfinite(all.loss) && std::isfinite(gnorm)))) {
      ckpt_->wait_snapshot();  // an async save's staging copy of the state is complete
      opt_->step(s.lr);
      if (ema_) ema_->update();
    }
    if (step_ < s.step) profiler_->after_step(++step_);  // read at once: counted here
    record_step(s.step, all, s.seconds >= 0 ? s.seconds : seconds_since(s.t0), s.lr, gnorm, s.mine.flops);
    return {anomaly, all};
  }

  // The step's micro-batches through forward and backward, gradients summed over ranks and clipped.
  // *stats: (2,) float64 on the device, [loss sum, grad norm before clipping (same on every rank)].
  RankStats forward_backward(std::vector<data::Batch>& batches, torch::Tensor* stats) {
    const int64_t accum = cfg_.train.grad_accum;
    RankStats mine;
    std::vector<uint64_t> hashes;
    step_batches_ = loader_->state().batches;
    for (int64_t m = 0; m < accum; ++m) {  // the micro-batches first: their token count normalises the loss
      if (!cfg_.data.reuse_batch || batches[m].rows == 0) {
        batches[m] = loader_->next();
        mine.wait_ms += loader_->last_wait_ms();
        source_tokens_->add(batches[m]);
      }
      mine.targets += batches[m].target_tokens;
      mine.pad += batches[m].pad_tokens;
      mine.inputs += batches[m].rows * batches[m].cols;
      mine.flops += static_cast<double>(batches[m].rows * batches[m].cols - batches[m].pad_tokens) *
                    flops_per_token(cfg_.model, vocab_, batches[m].cols);  // real tokens at this length
      hashes.push_back(batches[m].hash);
    }
    mine.hash = accum == 1 ? hashes[0] : xxh64(hashes.data(), hashes.size() * sizeof(uint64_t));
    const double global_targets = global_target_tokens(mine.targets, cfg_.data.mode == "packed", comm_.get(), world_);
    flat_->zero_grad();
    torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device_));
    for (int64_t m = 0; m < accum; ++m) {
      auto& b = batches[m];
      auto x = uploader_->upload(b.inputs, b.rows, b.cols);  // (B, T) int64
      auto y = uploader_->upload(b.targets, b.rows, b.cols);
      if (grad_sync_) grad_sync_->begin(m == accum - 1);
      if (bf16_) compat::set_autocast(device_, true);
      auto loss = b.rows > 0 ? model_->loss_sum(x, y) : torch::zeros({}, torch::TensorOptions().device(device_));
      if (bf16_) compat::set_autocast(device_, false);
      if (step_ + 1 == fault_nan_step_) loss = loss * std::nan("");  // fault injection (tests): a non-finite step
      if (b.rows > 0) (loss / global_targets).backward();
      if (bf16_) compat::clear_autocast_cache();
      loss_sum += loss.detach();
    }
    if (grad_sync_) grad_sync_->finish(step_ + 1);
    *stats = torch::stack({loss_sum.to(torch::kDouble), clip_grad_norm(*flat_, cfg_.optim.grad_clip).to(torch::kDouble)});
    return mine;
  }

  // The step's totals into the training log; a "train" record every log.every_steps steps.
  void record_step(int64_t step, const GlobalStats& all, double step_s, double lr, double gnorm, double flops) {
    tokens_ += all.targets;
    ckpt_->step_done(step_s);  // measures an in-flight save's real stall
    train_log_.add({all.loss, step_s, all.wait_max_ms, all.targets, all.pad, all.inputs, flops, step > start_step_ + 1});
    window_nonfinite_ |= !std::isfinite(all.loss);
    if (step == start_step_ + 1 && !resume_.dir.empty() && metrics_)
      metrics_->write({{records::kKind, records::kResume}, {records::kStep, step}, {records::kCheckpointDir, resume_.dir},
                       {records::kTime, unix_now()}, {records::kRecoveryMs, 1e3 * clock::process_age_s()},
                       {records::kLoadMs, load_ms_}});
    if (step % cfg_.log.every_steps == 0 || step == cfg_.train.max_steps) log_window(lr, gnorm);
  }

  // Validation, checkpoints and stops after a step; false when the run stops here.
  bool after_step(const std::string& anomaly, const GlobalStats& all) {
    if (eval_ && cfg_.eval.every_steps > 0 && step_ % cfg_.eval.every_steps == 0 && step_ != cfg_.train.max_steps)
      evaluate();
    log_saves();
    if (!anomaly.empty() && cfg_.anomaly.action == "stop") {
      save_and_wait();
      throw Error(strf("stopped at step %lld by an anomaly (%s); evidence in %s, checkpoint saved", (long long)step_,
                       anomaly.c_str(), run_dir::anomalies(cfg_.run.dir).c_str()));
    }
    if (all.stop) {
      log::warn(strf("stop signal: checkpointing at step %lld and exiting", (long long)step_));
      save_and_wait();
      stopped_ = true;
      return false;
    }
    if (all.save) save();
    return true;
  }

  // ---- records --------------------------------------------------------------------------------
  int64_t epoch() const {
    const int64_t per_epoch = std::max<int64_t>(1, loader_->samples_per_epoch());
    return static_cast<int64_t>(loader_->state().cursor) / per_epoch;
  }

  // A window with a non-finite step logs loss NaN (null in the file; TrainLog counts it as 0).
  void log_window(double lr, double gnorm) {
    const auto t0 = Clock::now();  // building the record counts as telemetry (record_ms_)
    const auto w = train_log_.close();
    const double loss = window_nonfinite_ ? std::nan("") : w.loss;
    window_nonfinite_ = false;
    if (rank_ != 0) return;
    namespace r = records;
    nlohmann::json rec = {{r::kKind, r::kTrain}, {r::kStep, step_}, {r::kTime, unix_now()}, {r::kLoss, loss},
                          {r::kLr, lr}, {r::kGradNorm, gnorm}, {r::kTokensPerS, w.tokens_per_s},
                          {r::kTokensPerSRank, w.tokens_per_s / world_}, {r::kStepMs, w.step_ms},
                          {r::kDataWaitMs, w.wait_ms}, {r::kDataWaitPct, w.wait_pct}, {r::kMemMb, memory_mb(device_)},
                          {r::kTokens, tokens_}, {r::kEpoch, epoch()}, {r::kBatchHash, hex64(batch_hash_)}};
    // MFU of rank 0's device: its matmul FLOPs over the window's step time, against the peak
    // (start_telemetry says which); unknown without one.
    rec[r::kMfuPct] = peak_.pct(w.flops_per_s);  // NaN (null) when unknown
    if (cfg_.data.mode == "bucketed") rec[r::kPaddingPct] = w.padding_pct;
    rec[r::kCpuStealPct] = steal_.take_pct();  // NaN (null) when unknown
    source_tokens_->close(rec);
    record_ms_ += 1e3 * seconds_since(t0);
    metrics_->write(std::move(rec));
  }

  void record_anomaly(int64_t step, const std::string& why, double loss, double gnorm, double lr,
                      const std::vector<data::Batch>& batches) {
    const std::string& action = cfg_.anomaly.action;
    if (rank_ == 0) {
      log::warn(strf("anomaly at step %lld: %s (action: %s)", (long long)step, why.c_str(), action.c_str()));
      metrics_->write({{records::kKind, records::kAnomaly}, {records::kStep, step}, {records::kTime, unix_now()},
                       {records::kReason, why}, {records::kLoss, finite_or_null(loss)},
                       {records::kGradNorm, finite_or_null(gnorm)}, {records::kAction, action},
                       {records::kBatchHash, hex64(batch_hash_)}});
    }
    if (dumps_ >= cfg_.anomaly.max_dumps) return;
    ++dumps_;
    const auto& recent = detector_.recent_losses();
    write_anomaly_evidence(cfg_.run.dir, rank_,
                           {step, why, action, loss, gnorm, lr, world_, batch_hash_, {recent.begin(), recent.end()},
                            rank_ == 0 ? nlohmann::json::parse(to_json(cfg_)) : nlohmann::json()},
                           batches, sources_);
  }

  // The validation loss (and, with EMA, the EMA weights' loss) as a "val" record.
  void evaluate() {
    nlohmann::json rec = {{records::kKind, records::kVal}, {records::kStep, step_}, {records::kValData, eval_->dir()},
                          {records::kValSplit, eval_->split()}};
    const double loss = eval_->mean_loss(model_, comm_.get());
    ckpt_->wait_snapshot();  // the EMA weights are swapped into the model below
    rec[records::kValLoss] = loss;
    rec[records::kTime] = unix_now();
    if (ema_) rec[records::kValLossEma] = ema_->with_weights([&] { return eval_->mean_loss(model_, comm_.get()); });
    val_loss_ = loss;
    if (rank_ == 0) metrics_->write(std::move(rec));
  }

  // ---- checkpoints ----------------------------------------------------------------------------
  void save() {
    const nlohmann::json run = {{"config", to_yaml(cfg_)}, {"arch", arch_json(cfg_.model, vocab_)},
                                {"data_version", data::mixture_version(cfg_.data, sources_)},
                                {"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}}};
    ckpt_->save(state_.snapshot(step_, run));
    log_saves();
  }
  void save_and_wait() { save(), ckpt_->wait(), log_saves(); }

  // Errors of the background writers (checkpoint writer, metrics sinks) arrive here, on the
  // training thread: checkpoint.on_error stop ends the run (one line, exit 1), continue warns.
  void background_error(const std::string& err) {
    if (cfg_.checkpoint.on_error == "stop") throw Error(err);
    log::warn(err + " (checkpoint.on_error: continue, training goes on)");
  }

  void log_saves() {
    if (auto err = metrics_ ? metrics_->take_error() : ""; !err.empty()) background_error(err);
    for (auto& r : ckpt_->finished()) {
      if (!r.error.empty()) {
        background_error("checkpoint at step " + std::to_string(r.step) + " failed: " + r.error);
        continue;
      }
      const double mbps = r.write_ms > 0 ? r.mb / (r.write_ms / 1e3) : 0;
      if (rank_ != 0) continue;
      log::info(strf("checkpoint %s: %.1f MB, blocked %.0f ms, written in %.0f ms (%.0f MB/s)%s", r.dir.c_str(), r.mb,
                     r.block_ms, r.write_ms, mbps, r.async ? ", async" : ""));
      metrics_->write({{records::kKind, records::kCheckpoint}, {records::kStep, r.step}, {records::kTime, unix_now()},
                       {records::kDir, r.dir}, {records::kAsync, r.async}, {records::kCkptBlockMs, r.block_ms},
                       {records::kCkptWriteMs, r.write_ms}, {records::kCkptMb, r.mb}, {records::kCkptMbPerS, mbps},
                       {records::kCkptStealMs, r.steal_ms}});
    }
  }

  TrainSummary summary(Clock::time_point t_start) {
    TrainSummary sum;
    sum.steps = step_, sum.first_loss = train_log_.first_loss(), sum.last_loss = train_log_.last_loss();
    sum.val_loss = val_loss_, sum.wall_s = seconds_since(t_start), sum.tokens_per_s = train_log_.tokens_per_s();
    if (rank_ != 0) return sum;
    const double pad_pct = train_log_.padding_pct();
    const bool bucketed = cfg_.data.mode == "bucketed";
    log::info(strf("done: %lld steps in %.1f s | loss %.4f -> %.4f | val loss %.4f | %.0f tok/s%s", (long long)sum.steps,
                   sum.wall_s, sum.first_loss, sum.last_loss, sum.val_loss, sum.tokens_per_s,
                   bucketed ? strf(" | padding %.1f%%", pad_pct).c_str() : ""));
    const double steps = static_cast<double>(std::max<int64_t>(1, step_ - start_step_));
    const double telemetry_ms = (record_ms_ + metrics_->caller_ms()) / steps;
    namespace r = records;
    nlohmann::json j{{r::kSteps, sum.steps}, {r::kFirstLoss, sum.first_loss}, {r::kLastLoss, sum.last_loss},
                     {r::kValLoss, sum.val_loss}, {r::kTokensPerS, sum.tokens_per_s}, {r::kWallS, sum.wall_s},
                     {r::kWorldSize, world_}, {r::kTelemetryMsPerStep, telemetry_ms},
                     {r::kTelemetrySinkCpuMsPerStep, metrics_->sink_cpu_ms() / steps}};
    if (bucketed) j[r::kPaddingPct] = pad_pct;
    files::write_file_atomic(run_dir::summary(cfg_.run.dir), j.dump(2) + "\n");
    return sum;
  }

  std::unique_ptr<DirLock> lock_;  // RUN_DIR/run.lock (rank 0); first member: released last
  // Config and environment.
  ExperimentConfig cfg_;
  LaunchEnv launch_;
  torch::Device device_;
  int rank_ = 0, world_ = 1;
  std::vector<data::Manifest> sources_;  // data: data.train's manifest alone, or a mixture's sources'
  data::Manifest manifest_;              // sources_[0]: the tokenizer, the val split
  std::unique_ptr<SourceTokens> source_tokens_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<BatchUploader> uploader_;
  std::unique_ptr<Evaluator> eval_;
  int64_t data_vocab_ = 0, vocab_ = 0, params_ = 0;
  // Model, optimizer and their state.
  LM model_{nullptr};
  std::unique_ptr<FlatParams> flat_;
  std::unique_ptr<AdamW> opt_;
  std::unique_ptr<Ema> ema_;
  RngStreams rng_;
  AnomalyDetector detector_;
  LrSchedule schedule_;
  TrainLog train_log_;
  StateRegistry state_;
  bool bf16_ = false;  // bf16 autocast around forward passes (CUDA; CPU on LibTorch >= 2.4)
  double flops_per_token_ = 0;
  MfuPeak peak_;
  // Distributed.
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<GradSync> grad_sync_;
  // Checkpoints and resume.
  std::unique_ptr<Checkpointer> ckpt_;
  ResumePoint resume_;
  nlohmann::json long_window_;  // the sink's resumed long window, applied once the sink exists
  double load_ms_ = 0, record_ms_ = 0;  // resume's load; rank 0 building train records (telemetry)
  // Telemetry.
  std::unique_ptr<MetricsSink> metrics_;
  std::unique_ptr<RunRecord> record_;
  std::unique_ptr<StepProfiler> profiler_;
  clock::StealMeter steal_;  // cpu_steal_pct of the train records (rank 0)
  // Progress.
  int64_t step_ = 0, start_step_ = 0, tokens_ = 0, dumps_ = 0;
  // Fault injection for tests: LM_FAULT_NAN_STEP=<step> makes that step's loss and gradients NaN.
  const int64_t fault_nan_step_ = std::getenv("LM_FAULT_NAN_STEP") ? std::atoll(std::getenv("LM_FAULT_NAN_STEP")) : 0;
  uint64_t batch_hash_ = 0, step_batches_ = 0;  // step_batches_: loader batches before this step
  double mean_step_s_ = 0, val_loss_ = -1;
  bool stopped_ = false, window_nonfinite_ = false;  // window_nonfinite_: a step of the open window was non-finite
  bool deferred_ = false;           // read step results one step late (see train_step)
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
