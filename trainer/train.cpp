// The training loop (see train.h).
#include "trainer/train.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <torch/csrc/autograd/profiler_legacy.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <iostream>
#include <sstream>

#include "data/loader/loader.h"
#include "data/format/manifest.h"
#include "data/loader/val_reader.h"
#include "models/gpt.h"
#include "common/build_info.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/cli.h"
#include "common/compat.h"
#include "trainer/runtime/device.h"
#include "trainer/dist/dist.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "trainer/runtime/host_allocator.h"
#include "common/log.h"
#include "trainer/telemetry/metrics.h"
#include "trainer/optim/optim.h"
#include "trainer/telemetry/run_record.h"
#include "trainer/checkpoint/safetensors.h"

namespace lm {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Seconds since this process started (from /proc: includes dynamic loading before main).
double process_age_s() {
  std::ifstream stat("/proc/self/stat"), up("/proc/uptime");
  std::string s((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  double uptime = 0;
  up >> uptime;
  auto rp = s.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream rest(s.substr(rp + 2));
  std::string field;
  unsigned long long start_ticks = 0;
  for (int i = 3; i <= 22 && rest >> field; ++i)
    if (i == 22) start_ticks = std::stoull(field);
  return uptime - static_cast<double>(start_ticks) / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// SIGTERM / SIGINT: the first asks the loop to checkpoint and exit 0 after the current step; a
// second one aborts at once (default action).
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) {
  if (g_stop_signal.exchange(sig) != 0) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

torch::Device pick_device(const std::string& want) {
  if (want == "cuda" || (want == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available()) throw ConfigError("key 'train.device': cuda requested but LibTorch has no CUDA device");
    return torch::Device(torch::kCUDA, 0);
  }
  return torch::Device(torch::kCPU);
}

std::string to_hex(const torch::Tensor& bytes) {
  auto c = bytes.contiguous();
  std::string out;
  const auto* p = c.data_ptr<uint8_t>();
  for (int64_t i = 0; i < c.numel(); ++i) out += strf("%02x", p[i]);
  return out;
}
torch::Tensor from_hex(const std::string& hex) {
  auto t = torch::empty({static_cast<int64_t>(hex.size() / 2)}, torch::kUInt8);
  auto* p = t.data_ptr<uint8_t>();
  for (size_t i = 0; i + 1 < hex.size(); i += 2) p[i / 2] = static_cast<uint8_t>(std::stoul(hex.substr(i, 2), nullptr, 16));
  return t;
}

// The architecture a checkpoint must match (vocab is the padded one).
nlohmann::json arch_json(const ModelConfig& m, int64_t vocab) {
  return {{"arch", m.arch}, {"n_layer", m.n_layer}, {"n_head", m.n_head}, {"d_model", m.d_model},
          {"seq_len", m.seq_len}, {"vocab", vocab}};
}

// (B, T+1) windows of the sequential (validation) reader -> inputs and targets on `device`.
struct Batch {
  torch::Tensor x, y;  // (B, T) int64
};
Batch next_val_batch(data::SequentialReader& r, int64_t B, int64_t T, std::vector<int64_t>& buf,
                     const torch::Device& device) {
  r.next(B, buf);
  auto w = torch::from_blob(buf.data(), {B, T + 1}, torch::kLong).to(device, /*non_blocking=*/false, /*copy=*/true);
  return {w.slice(1, 0, T), w.slice(1, 1, T + 1)};
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int64_t double_bits(double d) {
  int64_t i;
  std::memcpy(&i, &d, sizeof i);
  return i;
}
double bits_double(int64_t i) {
  double d;
  std::memcpy(&d, &i, sizeof d);
  return d;
}

// What every rank reports after a step (gathered so rank 0 can log global values and all ranks
// take the same save/stop decisions).
enum Stat { kLossSum, kTargets, kPad, kInputs, kWaitUs, kStop, kSave, kHash, kNumStats };

// Windows that survive a resume: the logging window and the run summary's accumulators.
struct Windows {
  double loss = 0, time = 0, wait = 0, tokens = 0, pad = 0, inputs = 0;  // logging window
  int64_t steps = 0;
  double first_loss = -1, last_loss = 0, timed_tokens = 0, timed_s = 0;  // whole run
  double run_pad = 0, run_inputs = 0;
  nlohmann::json to_json() const {
    return {{"loss", loss}, {"time", time}, {"wait", wait}, {"tokens", tokens}, {"pad", pad},
            {"inputs", inputs}, {"steps", steps}, {"first_loss", first_loss}, {"last_loss", last_loss},
            {"timed_tokens", timed_tokens}, {"timed_s", timed_s}, {"run_pad", run_pad},
            {"run_inputs", run_inputs}};
  }
  void from_json(const nlohmann::json& j) {
    loss = j.at("loss"), time = j.at("time"), wait = j.at("wait"), tokens = j.at("tokens");
    pad = j.at("pad"), inputs = j.at("inputs"), steps = j.at("steps"), first_loss = j.at("first_loss");
    last_loss = j.at("last_loss"), timed_tokens = j.at("timed_tokens"), timed_s = j.at("timed_s");
    run_pad = j.at("run_pad"), run_inputs = j.at("run_inputs");
  }
};

class Trainer {
 public:
  Trainer(const ExperimentConfig& cfg, const std::string& command)
      : cfg_(cfg), device_(pick_device(cfg.train.device)), launch_(LaunchEnv::from_environment()) {
    rank_ = launch_.rank;
    world_ = launch_.world_size;
    // All input is checked before anything is printed or written.
    manifest_ = data::Manifest::load(cfg.data.train);
    const int64_t data_vocab = static_cast<int64_t>(manifest_.tokenizer.vocab_size);
    if (cfg.model.vocab_size > 0 && cfg.model.vocab_size < data_vocab)
      throw ConfigError("key 'model.vocab_size': " + std::to_string(cfg.model.vocab_size) +
                        " is smaller than the data's vocabulary (" + std::to_string(data_vocab) + ")");
    loader_ = std::make_unique<data::Loader>(cfg.data, manifest_, "train", cfg.model.seq_len,
                                             cfg.train.micro_batch_size, rank_, world_,
                                             static_cast<uint64_t>(cfg.run.seed));
    if (cfg.eval.batches > 0) {
      val_manifest_ = cfg.data.val.empty() ? manifest_ : data::Manifest::load(cfg.data.val);
      std::string split = val_manifest_.split_tokens("val") > 0 ? "val" : "train";
      if (val_manifest_.split_tokens(split) > static_cast<uint64_t>(cfg.model.seq_len))
        val_reader_ = std::make_unique<data::SequentialReader>(val_manifest_, split, cfg.model.seq_len);
      else if (rank_ == 0)
        log::warn("no validation data in " + val_manifest_.dir + ": validation disabled");
    }
    vocab_ = padded_vocab(cfg.model, data_vocab);
    if (cfg.train.dtype == "bf16" && !device_.is_cuda())
      throw ConfigError("key 'train.dtype': bf16 autocast needs a CUDA device (train.device=" + cfg.train.device + ")");

    const auto& run_dir = cfg.run.dir;
    files::make_dirs(run_dir + "/logs");
    log::init(run_dir + "/logs/rank_" + std::to_string(rank_) + ".log", /*console=*/rank_ == 0, rank_, world_);
    if (world_ > 1) {
      log::info(strf("rank %d of %d (%s launch, local rank %d), rendezvous %s:%d", rank_, world_,
                     launch_.source.c_str(), launch_.local_rank, launch_.master_addr.c_str(), launch_.master_port));
      if (cfg.dist.backend == "nccl" || (cfg.dist.backend == "auto" && device_.is_cuda())) {
        // NCCL's own log, kept per rank with the run ("why did it break").
        ::setenv("NCCL_DEBUG", "INFO", /*overwrite=*/0);
        ::setenv("NCCL_DEBUG_FILE", (run_dir + "/logs/nccl_rank" + std::to_string(rank_) + ".%h.%p.log").c_str(), 0);
      }
      comm_ = std::make_unique<Comm>(launch_, cfg.dist, device_);
    }
    ckpt_ = std::make_unique<Checkpointer>(cfg.checkpoint, run_dir, rank_, world_);
    find_and_load_resume();
    if (rank_ == 0) {
      log::info("trainer: " + command);
      log::info("resolved config (* = not the default):\n" + to_table(cfg));
      files::write_file_atomic(run_dir + "/config.yaml", to_yaml(cfg));
    }

    install_caching_host_allocator();
    // 0 keeps LibTorch's default. Debian's LibTorch uses one intra-op thread and lets OpenBLAS
    // thread the matmuls itself: measured fastest on 2 cores (torch and BLAS both threaded spin
    // against each other and run ~2x slower).
    if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
    torch::manual_seed(static_cast<uint64_t>(cfg.run.seed));  // identical init on every rank
    model_ = GPT(cfg.model, vocab_);
    model_->to(device_);
    uploader_ = std::make_unique<BatchUploader>(device_);
    flat_ = std::make_unique<FlatParams>(*model_);
    opt_ = std::make_unique<AdamW>(*flat_, cfg.optim);
    if (cfg.train.ema_decay > 0) ema_ = flat_->params().clone();
    // Each rank's own dropout stream.
    torch::manual_seed(static_cast<uint64_t>(cfg.run.seed) ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(rank_ + 1)));
    const int64_t n = model_->num_params();
    flops_per_token_ = flops_per_token(cfg.model, n);
    log::info(strf("model: gpt, %lld parameters (%.2fM), vocab %lld (data %lld), %.3g FLOPs/token "
                   "(6N + 12*L*d*T, N=%lld)", (long long)n, n / 1e6, (long long)vocab_,
                   (long long)data_vocab, flops_per_token_, (long long)n));
    log::info(strf("data: %s, %llu train tokens, data version %s, tokenizer %s, %s mode, %lld samples/epoch",
                   manifest_.dir.c_str(), (unsigned long long)manifest_.split_tokens("train"),
                   manifest_.data_version.c_str(), manifest_.tokenizer.kind.c_str(), cfg.data.mode.c_str(),
                   (long long)loader_->samples_per_epoch()));
    log::info(strf("device: %s, LibTorch %s, %d threads, world size %d", device_.str().c_str(),
                   compat::torch_version().c_str(), torch::get_num_threads(), world_));
    if (!resume_dir_.empty()) restore();
    if (comm_) {
      comm_->broadcast(flat_->params(), 0, "broadcast of the initial parameters");
      grad_sync_ = std::make_unique<GradSync>(*comm_, *flat_, *model_, cfg.dist.bucket_mb);
      log::info(strf("data parallel: %s, %zu gradient buckets of <= %.0f MB", comm_->backend().c_str(),
                     grad_sync_->num_buckets(), cfg.dist.bucket_mb));
    }
    if (!cfg.log.profile_steps.empty())
      std::sscanf(cfg.log.profile_steps.c_str(), "%lld-%lld", (long long*)&profile_from_, (long long*)&profile_to_);
    gpu_ = gpu_info(device_);
    bf16_ = cfg.train.dtype == "bf16";
    if (device_.is_cuda()) at::globalContext().setFloat32MatmulPrecision("high");  // TF32 for fp32 matmuls
    const double peak = cfg.log.peak_tflops > 0 ? cfg.log.peak_tflops : builtin_peak_tflops(gpu_.model, cfg.train.dtype);
    peak_flops_ = peak * 1e12;
    log::info(peak_flops_ > 0 ? strf("MFU against %.0f TFLOP/s per device", peak)
                              : std::string("MFU unknown: no peak for this device (set log.peak_tflops)"));
    if (rank_ == 0) {
      MetricsSink::Options mo;
      mo.run_dir = run_dir;
      mo.keep_through_step = resume_dir_.empty() ? -1 : step_;
      mo.tensorboard = cfg.log.tensorboard;
      mo.total_steps = cfg.train.max_steps;
      mo.long_window_s = cfg.log.long_window_s;
      metrics_ = std::make_unique<MetricsSink>(mo);
      if (!resume_dir_.empty() && resume_state_.state.at("metrics").contains("long_window"))
        metrics_->load_window_state(resume_state_.state.at("metrics").at("long_window"));
      record_ = std::make_unique<RunRecord>(run_dir, run_meta(command, n));
    }
    gpu_snapshot("start");
  }

  TrainSummary run() {
    const auto& c = cfg_;
    const int64_t accum = c.train.grad_accum;
    auto t_start = Clock::now();
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGINT, on_stop_signal);
    std::signal(SIGXFSZ, SIG_IGN);  // a file-size limit fails the write (EFBIG) instead of killing us
    double mean_step_s = 0;
    std::vector<data::Batch> batches(static_cast<size_t>(accum));
    std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
    model_->train();
    while (step_ < c.train.max_steps) {
      if (profile_from_ > 0 && step_ + 1 == profile_from_) {
        files::make_dirs(c.run.dir + "/profile");
        profile = std::make_unique<torch::autograd::profiler::RecordProfile>(
            c.run.dir + "/profile/" + strf("steps_%lld-%lld.rank%d.trace.json", (long long)profile_from_,
                                           (long long)profile_to_, rank_));
      }
      auto t0 = Clock::now();
      // The step's micro-batches first: their token count normalises the loss.
      int64_t local[kNumStats] = {0};
      double wait_ms = 0;
      std::vector<uint64_t> hashes;
      for (int64_t m = 0; m < accum; ++m) {
        if (!c.data.reuse_batch || batches[m].rows == 0) {
          batches[m] = loader_->next();
          wait_ms += loader_->last_wait_ms();
        }
        local[kTargets] += batches[m].target_tokens;
        local[kPad] += batches[m].pad_tokens;
        local[kInputs] += batches[m].rows * batches[m].cols;
        hashes.push_back(batches[m].hash);
      }
      local[kHash] = static_cast<int64_t>(accum == 1 ? hashes[0] : xxh64(hashes.data(), hashes.size() * sizeof(uint64_t)));
      const double global_targets = global_target_tokens(local[kTargets]);
      flat_->zero_grad();
      torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device_));
      for (int64_t m = 0; m < accum; ++m) {
        auto& b = batches[m];
        auto x = uploader_->upload(b.inputs, b.rows, b.cols);
        auto y = uploader_->upload(b.targets, b.rows, b.cols);
        if (grad_sync_) grad_sync_->begin(m == accum - 1);
        if (bf16_) compat::set_cuda_autocast(true);
        auto loss = b.rows > 0 ? model_->loss_sum(x, y) : torch::zeros({}, torch::TensorOptions().device(device_));
        if (bf16_) compat::set_cuda_autocast(false);
        if (b.rows > 0) (loss / global_targets).backward();
        if (bf16_) compat::clear_autocast_cache();
        loss_sum += loss.detach();
      }
      if (grad_sync_) grad_sync_->finish(step_ + 1);
      const double gnorm = clip_grad_norm(*flat_, c.optim.grad_clip).item<double>();  // same on every rank
      local[kLossSum] = double_bits(loss_sum.item<double>());
      local[kWaitUs] = static_cast<int64_t>(wait_ms * 1e3);
      local[kStop] = g_stop_signal.load() != 0;
      const double step_s_local = seconds_since(t0);
      mean_step_s = mean_step_s == 0 ? step_s_local : 0.9 * mean_step_s + 0.1 * step_s_local;
      local[kSave] = step_ + 1 != c.train.max_steps && ckpt_->due(step_ + 1, mean_step_s);
      const auto all = gather_stats(local);
      double loss_total = 0, wait_max = 0;
      int64_t targets = 0, pad = 0, inputs = 0, stop = 0;
      std::vector<uint64_t> rank_hashes;
      for (int r = 0; r < world_; ++r) {
        const int64_t* s = &all[static_cast<size_t>(r) * kNumStats];
        loss_total += bits_double(s[kLossSum]);
        targets += s[kTargets], pad += s[kPad], inputs += s[kInputs];
        wait_max = std::max(wait_max, s[kWaitUs] / 1e3);
        stop |= s[kStop];
        rank_hashes.push_back(static_cast<uint64_t>(s[kHash]));
      }
      const bool save_now = all[kSave] != 0;  // rank 0 decides
      const double loss = loss_total / std::max<double>(1.0, static_cast<double>(targets));
      batch_hash_ = world_ == 1 ? rank_hashes[0] : xxh64(rank_hashes.data(), rank_hashes.size() * sizeof(uint64_t));
      const double lr = lr_at(c.schedule, c.optim.lr, c.train.max_steps, step_);
      // Every rank sees the same global loss and grad norm, so they take the same decision.
      const std::string anomaly = check_anomaly(loss, gnorm);
      const bool update = anomaly.empty() || (c.anomaly.action == "continue" && std::isfinite(loss) && std::isfinite(gnorm));
      if (!anomaly.empty()) record_anomaly(anomaly, loss, gnorm, lr, batches);
      if (update) {
        opt_->step(lr);
        if (ema_.defined()) ema_.lerp_(flat_->params(), 1.0 - c.train.ema_decay);
      }
      ++step_;
      if (profile && step_ == profile_to_) profile.reset();  // writes the trace
      const double step_s = seconds_since(t0);
      tokens_ += targets;
      win_.loss += std::isfinite(loss) ? loss : 0, win_.time += step_s, win_.wait += wait_max, win_.tokens += targets;
      win_.pad += pad, win_.inputs += inputs, ++win_.steps;
      win_.run_pad += pad, win_.run_inputs += inputs;
      if (step_ > start_step_ + 1) win_.timed_tokens += targets, win_.timed_s += step_s;
      if (step_ == start_step_ + 1 && !resume_dir_.empty() && metrics_)
        metrics_->write({{"kind", "resume"}, {"step", step_}, {"checkpoint", resume_dir_}, {"time", unix_now()},
                         {"recovery_ms", 1e3 * process_age_s()}, {"load_ms", load_ms_}});
      if (step_ % c.log.every_steps == 0 || step_ == c.train.max_steps) log_window(lr, gnorm);
      if (val_reader_ && c.eval.every_steps > 0 && step_ % c.eval.every_steps == 0 && step_ != c.train.max_steps)
        evaluate();
      log_saves();
      if (!anomaly.empty() && c.anomaly.action == "stop") {
        save();
        ckpt_->wait();
        log_saves();
        throw Error(strf("stopped at step %lld by an anomaly (%s); evidence in %s/anomalies, checkpoint saved",
                         (long long)step_, anomaly.c_str(), c.run.dir.c_str()));
      }
      if (stop) {
        log::warn(strf("stop signal: checkpointing at step %lld and exiting", (long long)step_));
        save();
        ckpt_->wait();
        log_saves();
        stopped_ = true;
        return summary(t_start);
      }
      if (save_now) save();
    }
    if (val_reader_) evaluate();
    if (ckpt_->last_save_step() != step_) save();  // always one at the end
    ckpt_->wait();
    log_saves();
    if (rank_ == 0)
      save_safetensors(c.run.dir + "/model.safetensors", module_tensors(*model_),
                       {{"format", "pt"}, {"arch", c.model.arch}, {"step", std::to_string(step_)}});
    return summary(t_start);
  }

  // After run() or a failure: meta.json's final status, telemetry cost, a GPU snapshot on failure.
  void finish(int exit_code, const std::string& error) {
    if (metrics_) metrics_->flush();
    if (!error.empty()) gpu_snapshot("failure");
    if (record_) record_->finish(!error.empty() ? "failed" : stopped_ ? "stopped" : "completed", exit_code, error);
  }

 private:
  // "" or why this step is an anomaly: non-finite loss or grad norm, or a loss spike above
  // anomaly.spike_factor x the running mean of the last anomaly.window normal steps.
  std::string check_anomaly(double loss, double gnorm) {
    const auto& a = cfg_.anomaly;
    if (!std::isfinite(loss)) return strf("non-finite loss (%g)", loss);
    if (!std::isfinite(gnorm)) return strf("non-finite grad norm (%g)", gnorm);
    double mean = 0;
    for (double l : recent_losses_) mean += l;
    if (!recent_losses_.empty()) mean /= static_cast<double>(recent_losses_.size());
    const bool spike = a.spike_factor > 0 && step_ + 1 > a.warmup_steps &&
                       static_cast<int64_t>(recent_losses_.size()) >= std::min<int64_t>(a.window, 10) &&
                       loss > a.spike_factor * mean;
    if (spike) return strf("loss spike: %.4f > %.2f x running mean %.4f", loss, a.spike_factor, mean);
    recent_losses_.push_back(loss);
    if (static_cast<int64_t>(recent_losses_.size()) > a.window) recent_losses_.pop_front();
    return "";
  }

  // RUN_DIR/anomalies/step_<N>/: every rank's batch (token ids and where each row came from) and,
  // from rank 0, the step's metrics: enough to replay the batch offline.
  void record_anomaly(const std::string& why, double loss, double gnorm, double lr, const std::vector<data::Batch>& batches) {
    const int64_t step = step_ + 1;
    const std::string action = cfg_.anomaly.action;
    if (rank_ == 0) {
      log::warn(strf("anomaly at step %lld: %s (action: %s)", (long long)step, why.c_str(), action.c_str()));
      metrics_->write({{"kind", "anomaly"}, {"step", step}, {"time", unix_now()}, {"reason", why},
                       {"loss", std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr)},
                       {"grad_norm", std::isfinite(gnorm) ? nlohmann::json(gnorm) : nlohmann::json(nullptr)},
                       {"action", action}, {"batch_hash", hex64(batch_hash_)}});
    }
    if (dumps_ >= cfg_.anomaly.max_dumps) return;
    ++dumps_;
    const std::string dir = cfg_.run.dir + "/anomalies/" + strf("step_%08lld", (long long)step);
    files::make_dirs(dir);
    nlohmann::json micro = nlohmann::json::array();
    for (const auto& b : batches) {
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t r = 0; r < b.rows; ++r) {
        const auto& o = b.origins[static_cast<size_t>(r)];
        rows.push_back({{"inputs", std::vector<int64_t>(b.inputs.begin() + r * b.cols, b.inputs.begin() + (r + 1) * b.cols)},
                        {"targets", std::vector<int64_t>(b.targets.begin() + r * b.cols, b.targets.begin() + (r + 1) * b.cols)},
                        {"shard", o.shard}, {"shard_file", manifest_.shards.at(o.shard).file}, {"doc", o.doc},
                        {"offset", o.offset}});
      }
      micro.push_back({{"batch_index", b.index}, {"epoch", b.epoch}, {"hash", hex64(b.hash)}, {"rows", rows}});
    }
    files::write_file_atomic(dir + "/rank_" + std::to_string(rank_) + ".json",
                          nlohmann::json{{"step", step}, {"rank", rank_}, {"data_dir", manifest_.dir},
                                         {"data_version", manifest_.data_version}, {"micro_batches", micro}}
                              .dump() + "\n");
    if (rank_ == 0)
      files::write_file_atomic(dir + "/step.json",
                            nlohmann::json{{"step", step}, {"reason", why}, {"action", action},
                                           {"loss", std::isfinite(loss) ? nlohmann::json(loss) : nlohmann::json(nullptr)},
                                           {"grad_norm", std::isfinite(gnorm) ? nlohmann::json(gnorm) : nlohmann::json(nullptr)},
                                           {"lr", lr}, {"world_size", world_}, {"batch_hash", hex64(batch_hash_)},
                                           {"recent_losses", recent_losses_}, {"config", nlohmann::json::parse(to_json(cfg_))}}
                                .dump(2) + "\n");
  }

  // nvidia-smi's view of the GPUs into RUN_DIR/logs/nvidia-smi_<when>.rank<r>.txt (CUDA only).
  void gpu_snapshot(const std::string& when) {
    if (!device_.is_cuda()) return;
    const std::string out = cfg_.run.dir + "/logs/nvidia-smi_" + when + ".rank" + std::to_string(rank_) + ".txt";
    if (std::system(("nvidia-smi > '" + out + "' 2>&1").c_str()) != 0) log::warn("nvidia-smi failed: see " + out);
  }

  // Target tokens of the whole step over all ranks (the loss is their mean). Packed batches all
  // hold micro_batch * seq_len targets; bucketed ones vary, so they are summed over ranks.
  double global_target_tokens(int64_t local) {
    if (!comm_) return static_cast<double>(std::max<int64_t>(local, 1));
    if (cfg_.data.mode == "packed") return static_cast<double>(local) * world_;
    auto t = torch::tensor({local}, torch::kLong);
    comm_->all_reduce_sum(t, "all-reduce of the step's token count");
    return static_cast<double>(std::max<int64_t>(t.item<int64_t>(), 1));
  }

  std::vector<int64_t> gather_stats(const int64_t* local) {
    if (!comm_) return std::vector<int64_t>(local, local + kNumStats);
    auto t = torch::from_blob(const_cast<int64_t*>(local), {kNumStats}, torch::kLong).clone();
    auto all = comm_->all_gather(t, strf("all-gather of step %lld statistics", (long long)step_)).contiguous();
    return std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
  }

  // Rank 0 picks the checkpoint (verifying checksums); every rank loads the same one.
  void find_and_load_resume() {
    int64_t step = -1;
    if (rank_ == 0) {
      resume_dir_ = ckpt_->load_resume(&resume_state_);
      if (!resume_dir_.empty()) step = resume_state_.step;
    }
    if (comm_) {
      auto t = torch::tensor({step}, torch::kLong);
      comm_->broadcast(t, 0, "broadcast of the resume step");
      step = t.item<int64_t>();
      if (rank_ != 0 && step >= 0) {
        resume_dir_ = cfg_.checkpoint.resume != "auto" ? cfg_.checkpoint.resume
                                                       : ckpt_->dir() + "/" + strf("step_%08lld", (long long)step);
        resume_state_ = ckpt_->load(resume_dir_);
      }
    }
    if (step >= 0) check_compatible();
  }

  // A checkpoint trained with another architecture or on other data is refused unless forced.
  void check_compatible() {
    auto mismatch = [&](const std::string& what, const nlohmann::json& theirs, const nlohmann::json& ours) {
      std::string msg = "checkpoint " + resume_dir_ + " has " + what + " " + theirs.dump() + ", the config gives " +
                        ours.dump();
      if (!cfg_.checkpoint.force) throw CheckpointError(msg + " (set checkpoint.force=true to load it anyway)");
      log::warn(msg + ": loading anyway (checkpoint.force)");
    };
    const auto& st = resume_state_.state;
    auto ours = arch_json(cfg_.model, vocab_);
    if (st.at("arch") != ours) mismatch("model architecture", st.at("arch"), ours);
    if (st.at("data_version") != manifest_.data_version)
      mismatch("data version", st.at("data_version"), manifest_.data_version);
  }

  // Everything a resume needs, composed under fixed keys.
  CheckpointState snapshot() {
    CheckpointState st;
    st.step = step_;
    st.state = {{"progress", {{"step", step_}, {"tokens", tokens_}, {"epoch", epoch()}}},
                {"optimizer", {{"kind", "adamw"}, {"step", opt_->steps()}}},
                {"scheduler", {{"kind", cfg_.schedule.kind}, {"step", step_}, {"lr", lr_at(cfg_.schedule, cfg_.optim.lr, cfg_.train.max_steps, step_)}}},
                {"metrics", metrics_state()},
                {"config", to_yaml(cfg_)},
                {"arch", arch_json(cfg_.model, vocab_)},
                {"data_version", manifest_.data_version},
                {"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}}};
    if (rank_ == 0) {
      st.model = module_tensors(*model_);
      for (const auto& e : flat_->entries()) {
        st.optimizer.emplace_back("exp_avg/" + e.name, opt_->exp_avg().narrow(0, e.offset, e.numel));
        st.optimizer.emplace_back("exp_avg_sq/" + e.name, opt_->exp_avg_sq().narrow(0, e.offset, e.numel));
        if (ema_.defined()) st.ema.emplace_back(e.name, ema_.narrow(0, e.offset, e.numel));
      }
    }
    nlohmann::json rng = {{"cpu", to_hex(at::detail::getDefaultCPUGenerator().get_state())}};
    if (auto cuda = cuda_rng_state(device_); cuda.defined()) rng["cuda"] = to_hex(cuda);
    st.rank_state = {{"rank", rank_}, {"loader", nlohmann::json::parse(loader_->state().to_json())}, {"rng", rng}};
    return st;
  }

  // Windows that must survive a resume: logging window, run summary, anomaly running mean and
  // the long-window aggregates (rank 0's sink).
  nlohmann::json metrics_state() {
    auto j = win_.to_json();
    j["recent_losses"] = std::vector<double>(recent_losses_.begin(), recent_losses_.end());
    if (metrics_) j["long_window"] = metrics_->window_state();
    return j;
  }

  void save() {
    ckpt_->save(snapshot());
    log_saves();
  }

  void restore() {
    const auto t0 = Clock::now();
    auto& st = resume_state_;
    load_into_module(*model_, st.model, resume_dir_ + "/model.safetensors");
    std::map<std::string, torch::Tensor> opt(st.optimizer.begin(), st.optimizer.end());
    std::map<std::string, torch::Tensor> ema(st.ema.begin(), st.ema.end());
    torch::NoGradGuard ng;
    for (const auto& e : flat_->entries()) {
      auto get = [&](std::map<std::string, torch::Tensor>& m, const std::string& key) {
        auto it = m.find(key);
        if (it == m.end() || it->second.numel() != e.numel)
          throw CheckpointError(resume_dir_ + ": missing or mis-shaped optimizer/EMA tensor '" + key + "'");
        return it->second.reshape({-1});
      };
      opt_->exp_avg().narrow(0, e.offset, e.numel).copy_(get(opt, "exp_avg/" + e.name));
      opt_->exp_avg_sq().narrow(0, e.offset, e.numel).copy_(get(opt, "exp_avg_sq/" + e.name));
      if (ema_.defined()) {
        if (!ema.empty()) ema_.narrow(0, e.offset, e.numel).copy_(get(ema, e.name));
        else ema_.narrow(0, e.offset, e.numel).copy_(flat_->params().narrow(0, e.offset, e.numel));
      }
    }
    opt_->set_steps(st.state.at("optimizer").at("step").get<int64_t>());
    step_ = start_step_ = st.state.at("progress").at("step").get<int64_t>();
    tokens_ = st.state.at("progress").at("tokens").get<int64_t>();
    win_.from_json(st.state.at("metrics"));
    recent_losses_.clear();
    for (double l : st.state.at("metrics").value("recent_losses", std::vector<double>{})) recent_losses_.push_back(l);
    if (st.state.at("data_version") == manifest_.data_version)
      loader_->load_state(data::LoaderState::from_json(st.rank_state.at("loader").dump()));
    else
      log::warn("other data than the checkpoint's (checkpoint.force): the data order starts from the beginning");
    if (st.rank_state.value("rank", -1) == rank_) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle on the shared generator
      gen.set_state(from_hex(st.rank_state.at("rng").at("cpu").get<std::string>()));
      if (st.rank_state.at("rng").contains("cuda"))
        set_cuda_rng_state(device_, from_hex(st.rank_state.at("rng").at("cuda").get<std::string>()));
    } else {
      log::warn(strf("%s has no state for rank %d (world size changed): the global data cursor is "
                     "rank 0's, dropout draws start anew", resume_dir_.c_str(), rank_));
    }
    load_ms_ = 1e3 * seconds_since(t0);
    log::info(strf("resumed from %s at step %lld (%.0f ms)", resume_dir_.c_str(), (long long)step_, load_ms_));
  }

  int64_t epoch() const {
    const int64_t per_epoch = std::max<int64_t>(1, loader_->samples_per_epoch());
    return static_cast<int64_t>(loader_->state().cursor) / per_epoch;
  }

  void log_window(double lr, double gnorm) {
    const double n = static_cast<double>(win_.steps);
    const double mean_loss = win_.loss / n, tps = win_.tokens / win_.time, step_ms = 1e3 * win_.time / n;
    const double wait_ms = win_.wait / n, wait_pct = 100.0 * win_.wait / 1e3 / win_.time;
    if (win_.first_loss < 0) win_.first_loss = mean_loss;
    win_.last_loss = mean_loss;
    if (rank_ == 0) {
      nlohmann::json rec = {{"kind", "train"}, {"step", step_}, {"time", unix_now()}, {"loss", mean_loss}, {"lr", lr},
                            {"grad_norm", gnorm}, {"tokens_per_s", tps}, {"tokens_per_s_rank", tps / world_},
                            {"step_ms", step_ms}, {"data_wait_ms", wait_ms}, {"data_wait_pct", wait_pct},
                            {"mem_mb", memory_mb(device_)}, {"tokens", tokens_}, {"epoch", epoch()},
                            {"batch_hash", hex64(batch_hash_)}};
      // MFU: model FLOPs per token x tokens/s per device over the device's peak; unknown without a peak.
      rec["mfu_pct"] = peak_flops_ > 0 ? nlohmann::json(100.0 * flops_per_token_ * tps / world_ / peak_flops_) : nlohmann::json(nullptr);
      if (cfg_.data.mode == "bucketed") rec["padding_pct"] = win_.inputs > 0 ? 100.0 * win_.pad / win_.inputs : 0.0;
      metrics_->write(std::move(rec));
    }
    win_.loss = win_.time = win_.wait = win_.tokens = win_.pad = win_.inputs = 0;
    win_.steps = 0;
  }

  // meta.json's facts: code, command, config, data, hardware, versions.
  nlohmann::json run_meta(const std::string& command, int64_t params) {
    nlohmann::json gpu = nullptr;
    if (!gpu_.model.empty())
      gpu = {{"model", gpu_.model}, {"driver", gpu_.driver}, {"cuda", gpu_.cuda}, {"nccl", gpu_.nccl}, {"count", gpu_.count}};
    char cwd[4096] = {0};
    return {{"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}},
            {"command", command},
            {"cwd", ::getcwd(cwd, sizeof cwd) ? cwd : ""},
            {"config", nlohmann::json::parse(to_json(cfg_))},
            {"data", {{"dir", manifest_.dir}, {"data_version", manifest_.data_version},
                      {"tokenizer", {{"kind", manifest_.tokenizer.kind}, {"vocab_size", manifest_.tokenizer.vocab_size},
                                     {"hash", manifest_.tokenizer.hash}}},
                      {"train_tokens", manifest_.split_tokens("train")}}},
            {"host", host_info()},
            {"gpu", gpu},
            {"libtorch", compat::torch_version()},
            {"world_size", world_},
            {"launch", launch_.source},
            {"model", {{"params", params}, {"flops_per_token", flops_per_token_}}}};
  }

  void log_saves() {
    for (auto& r : ckpt_->finished()) {
      if (!r.error.empty()) {
        log::error("checkpoint at step " + std::to_string(r.step) + " failed: " + r.error);
        if (cfg_.checkpoint.on_error == "stop") throw Error("checkpoint at step " + std::to_string(r.step) + " failed: " + r.error);
        continue;
      }
      const double mbps = r.write_ms > 0 ? r.mb / (r.write_ms / 1e3) : 0;
      if (rank_ != 0) continue;
      log::info(strf("checkpoint %s: %.1f MB, blocked %.0f ms, written in %.0f ms (%.0f MB/s)%s", r.dir.c_str(),
                     r.mb, r.block_ms, r.write_ms, mbps, r.async ? ", async" : ""));
      metrics_->write({{"kind", "checkpoint"}, {"step", r.step}, {"time", unix_now()}, {"dir", r.dir}, {"async", r.async},
                       {"ckpt_block_ms", r.block_ms}, {"ckpt_write_ms", r.write_ms}, {"ckpt_mb", r.mb},
                       {"ckpt_mb_per_s", mbps}});
    }
  }

  // Mean loss over eval.batches validation micro-batches, always the same ones (reader reset),
  // split over the ranks; with EMA also the loss of the EMA weights.
  void evaluate() {
    auto mean_loss = [&] {
      torch::NoGradGuard ng;
      model_->eval();
      val_reader_->reset();
      std::vector<int64_t> buf;
      double total = 0;
      for (int64_t i = 0; i < cfg_.eval.batches; ++i) {
        auto b = next_val_batch(*val_reader_, cfg_.train.micro_batch_size, cfg_.model.seq_len, buf, device_);
        if (i % world_ != rank_) continue;
        if (bf16_) compat::set_cuda_autocast(true);
        total += model_->loss(b.x, b.y).item<double>();
        if (bf16_) {
          compat::set_cuda_autocast(false);
          compat::clear_autocast_cache();
        }
      }
      model_->train();
      if (comm_) {
        auto t = torch::tensor({total}, torch::kDouble);
        comm_->all_reduce_sum(t, "all-reduce of the validation loss");
        total = t.item<double>();
      }
      return total / cfg_.eval.batches;
    };
    const double loss = mean_loss();
    nlohmann::json rec = {{"kind", "val"}, {"step", step_}, {"val_loss", loss}};
    rec["time"] = unix_now();
    if (ema_.defined()) {
      torch::NoGradGuard ng;
      auto saved = flat_->params().clone();
      flat_->params().copy_(ema_);
      rec["val_loss_ema"] = mean_loss();
      flat_->params().copy_(saved);
    }
    val_loss_ = loss;
    if (rank_ == 0) metrics_->write(std::move(rec));
  }

  TrainSummary summary(Clock::time_point t_start) {
    TrainSummary sum;
    sum.steps = step_;
    sum.first_loss = win_.first_loss;
    sum.last_loss = win_.last_loss;
    sum.val_loss = val_loss_;
    sum.wall_s = seconds_since(t_start);
    sum.tokens_per_s = win_.timed_s > 0 ? win_.timed_tokens / win_.timed_s : 0;
    if (rank_ != 0) return sum;
    const double pad_pct = win_.run_inputs > 0 ? 100.0 * win_.run_pad / win_.run_inputs : 0;
    log::info(strf("done: %lld steps in %.1f s | loss %.4f -> %.4f | val loss %.4f | %.0f tok/s%s",
                   (long long)sum.steps, sum.wall_s, sum.first_loss, sum.last_loss, sum.val_loss,
                   sum.tokens_per_s, cfg_.data.mode == "bucketed" ? strf(" | padding %.1f%%", pad_pct).c_str() : ""));
    const double telemetry_ms = metrics_->caller_ms() / std::max<int64_t>(1, step_ - start_step_);
    nlohmann::json j{{"steps", sum.steps}, {"first_loss", sum.first_loss}, {"last_loss", sum.last_loss},
                     {"val_loss", sum.val_loss}, {"tokens_per_s", sum.tokens_per_s}, {"wall_s", sum.wall_s},
                     {"world_size", world_}, {"telemetry_ms_per_step", telemetry_ms}};
    if (cfg_.data.mode == "bucketed") j["padding_pct"] = pad_pct;
    files::write_file_atomic(cfg_.run.dir + "/summary.json", j.dump(2) + "\n");
    return sum;
  }

  ExperimentConfig cfg_;
  torch::Device device_;
  LaunchEnv launch_;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<Comm> comm_;
  std::unique_ptr<GradSync> grad_sync_;
  data::Manifest manifest_, val_manifest_;
  std::unique_ptr<data::Loader> loader_;
  std::unique_ptr<BatchUploader> uploader_;
  std::unique_ptr<data::SequentialReader> val_reader_;
  int64_t vocab_ = 0;
  double flops_per_token_ = 0;
  GPT model_{nullptr};
  std::unique_ptr<FlatParams> flat_;
  std::unique_ptr<AdamW> opt_;
  torch::Tensor ema_;  // flat EMA of flat_->params(), when train.ema_decay > 0
  std::unique_ptr<Checkpointer> ckpt_;
  std::string resume_dir_;
  CheckpointState resume_state_;
  std::unique_ptr<MetricsSink> metrics_;
  std::unique_ptr<RunRecord> record_;
  GpuInfo gpu_;
  double peak_flops_ = 0;
  bool bf16_ = false;  // CUDA bf16 autocast around forward passes
  int64_t profile_from_ = 0, profile_to_ = 0;
  std::deque<double> recent_losses_;  // anomaly running mean
  int64_t dumps_ = 0;
  bool stopped_ = false;
  int64_t step_ = 0, start_step_ = 0, tokens_ = 0;
  uint64_t batch_hash_ = 0;
  double load_ms_ = 0, val_loss_ = -1;
  Windows win_;
};

const char* kUsage =
    "usage: trainer CONFIG.yaml [dotted.key=value ...]\n"
    "  Trains the experiment described by CONFIG.yaml; overrides beat the file.\n";

}  // namespace

TrainSummary train(const ExperimentConfig& cfg, const std::string& command) {
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

int trainer_cli(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && (args[0] == "-h" || args[0] == "--help")) {
    std::fputs(kUsage, stdout);
    return kExitOk;
  }
  if (args.empty()) throw UsageError("missing CONFIG.yaml (usage: trainer CONFIG.yaml [dotted.key=value ...])");
  if (args[0].find('=') != std::string::npos || (!args[0].empty() && args[0][0] == '-'))
    throw UsageError("the first argument must be the config file, got '" + args[0] + "'");
  std::vector<std::string> overrides;
  for (size_t i = 1; i < args.size(); ++i) {
    if (args[i].find('=') == std::string::npos)
      throw UsageError("argument '" + args[i] + "' is not a dotted.key=value override");
    overrides.push_back(args[i]);
  }
  auto cfg = load_config(args[0], overrides);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i ? " " : "") + std::string(argv[i]);
  train(cfg, command);
  return kExitOk;
}

}  // namespace lm
