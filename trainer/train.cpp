// The training loop (see train.h).
#include "trainer/train.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "data/manifest.h"
#include "data/reader.h"
#include "models/gpt.h"
#include "trainer/build_info.h"
#include "trainer/checkpoint.h"
#include "trainer/cli.h"
#include "trainer/compat.h"
#include "trainer/errors.h"
#include "trainer/fileio.h"
#include "trainer/host_allocator.h"
#include "trainer/log.h"
#include "trainer/optim.h"
#include "trainer/safetensors.h"

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

// RUN_DIR/metrics.jsonl: one JSON object per line, flushed per record. On resume, records of steps
// after the checkpoint (written before the crash) are dropped so the file reads as one run.
class MetricsFile {
 public:
  MetricsFile(const std::string& path, int64_t keep_through_step) {
    if (keep_through_step < 0) {
      out_.open(path, std::ios::trunc);
    } else {
      std::string kept;
      std::ifstream in(path);
      for (std::string line; std::getline(in, line);) {
        if (line.empty()) continue;
        auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
        if (j.is_discarded()) continue;  // a line cut by the crash
        if (j.value("step", int64_t{0}) <= keep_through_step) kept += line + "\n";
      }
      fs::write_file_atomic(path, kept);
      out_.open(path, std::ios::app);
    }
    if (!out_) throw Error(path + ": cannot open for writing");
  }
  void write(const nlohmann::json& rec) {
    out_ << rec.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

struct Batch {
  torch::Tensor x, y;  // (B, T) int64 inputs and targets on the device
};
Batch next_batch(data::SequentialReader& r, int64_t B, int64_t T, std::vector<int64_t>& buf,
                 const torch::Device& device) {
  r.next(B, buf);
  auto w = torch::from_blob(buf.data(), {B, T + 1}, torch::kLong).to(device, /*non_blocking=*/false, /*copy=*/true);
  return {w.slice(1, 0, T), w.slice(1, 1, T + 1)};
}

// Windows that survive a resume: the logging window and the run summary's accumulators.
struct Windows {
  double loss = 0, time = 0;
  int64_t steps = 0;
  double first_loss = -1, last_loss = 0, timed_tokens = 0, timed_s = 0;
  nlohmann::json to_json() const {
    return {{"loss", loss}, {"time", time}, {"steps", steps}, {"first_loss", first_loss},
            {"last_loss", last_loss}, {"timed_tokens", timed_tokens}, {"timed_s", timed_s}};
  }
  void from_json(const nlohmann::json& j) {
    loss = j.at("loss"), time = j.at("time"), steps = j.at("steps"), first_loss = j.at("first_loss");
    last_loss = j.at("last_loss"), timed_tokens = j.at("timed_tokens"), timed_s = j.at("timed_s");
  }
};

class Trainer {
 public:
  Trainer(const ExperimentConfig& cfg, const std::string& command)
      : cfg_(cfg), device_(pick_device(cfg.train.device)) {
    // All input is checked before anything is printed or written.
    manifest_ = data::Manifest::load(cfg.data.train);
    const int64_t data_vocab = static_cast<int64_t>(manifest_.tokenizer.vocab_size);
    if (cfg.model.vocab_size > 0 && cfg.model.vocab_size < data_vocab)
      throw ConfigError("key 'model.vocab_size': " + std::to_string(cfg.model.vocab_size) +
                        " is smaller than the data's vocabulary (" + std::to_string(data_vocab) + ")");
    train_reader_ = std::make_unique<data::SequentialReader>(manifest_, "train", cfg.model.seq_len);
    if (cfg.eval.batches > 0) {
      val_manifest_ = cfg.data.val.empty() ? manifest_ : data::Manifest::load(cfg.data.val);
      std::string split = val_manifest_.split_tokens("val") > 0 ? "val" : "train";
      if (val_manifest_.split_tokens(split) > static_cast<uint64_t>(cfg.model.seq_len))
        val_reader_ = std::make_unique<data::SequentialReader>(val_manifest_, split, cfg.model.seq_len);
      else
        log::warn("no validation data in " + val_manifest_.dir + ": validation disabled");
    }
    vocab_ = padded_vocab(cfg.model, data_vocab);
    ckpt_ = std::make_unique<Checkpointer>(cfg.checkpoint, cfg.run.dir, /*rank=*/0, /*world=*/1);
    resume_dir_ = ckpt_->find_resume();
    if (!resume_dir_.empty()) resume_state_ = ckpt_->load(resume_dir_);
    check_compatible();

    const auto& run_dir = cfg.run.dir;
    fs::make_dirs(run_dir + "/logs");
    log::init(run_dir + "/logs/rank_0.log");
    log::info("trainer: " + command);
    log::info("resolved config (* = not the default):\n" + to_table(cfg));
    fs::write_file_atomic(run_dir + "/config.yaml", to_yaml(cfg));

    install_caching_host_allocator();
    // 0 keeps LibTorch's default. Debian's LibTorch uses one intra-op thread and lets OpenBLAS
    // thread the matmuls itself: measured fastest on 2 cores (torch and BLAS both threaded spin
    // against each other and run ~2x slower).
    if (cfg.train.threads > 0) torch::set_num_threads(static_cast<int>(cfg.train.threads));
    torch::manual_seed(static_cast<uint64_t>(cfg.run.seed));
    model_ = GPT(cfg.model, vocab_);
    model_->to(device_);
    flat_ = std::make_unique<FlatParams>(*model_);
    opt_ = std::make_unique<AdamW>(*flat_, cfg.optim);
    if (cfg.train.ema_decay > 0) ema_ = flat_->params().clone();
    const int64_t n = model_->num_params();
    flops_per_token_ = flops_per_token(cfg.model, n);
    log::info(strf("model: gpt, %lld parameters (%.2fM), vocab %lld (data %lld), %.3g FLOPs/token "
                   "(6N + 12*L*d*T, N=%lld)", (long long)n, n / 1e6, (long long)vocab_,
                   (long long)data_vocab, flops_per_token_, (long long)n));
    log::info(strf("data: %s, %llu train tokens, data version %s, tokenizer %s",
                   manifest_.dir.c_str(), (unsigned long long)manifest_.split_tokens("train"),
                   manifest_.data_version.c_str(), manifest_.tokenizer.kind.c_str()));
    log::info(strf("device: %s, LibTorch %s, %d threads", device_.str().c_str(),
                   compat::torch_version().c_str(), torch::get_num_threads()));
    if (!resume_dir_.empty()) restore();
    metrics_ = std::make_unique<MetricsFile>(run_dir + "/metrics.jsonl", resume_dir_.empty() ? -1 : step_);
  }

  TrainSummary run() {
    const auto& c = cfg_;
    const int64_t B = c.train.micro_batch_size, T = c.model.seq_len, accum = c.train.grad_accum;
    const int64_t tokens_per_step = B * T * accum;
    auto t_start = Clock::now();
    std::signal(SIGTERM, on_stop_signal);
    std::signal(SIGINT, on_stop_signal);
    std::vector<int64_t> buf;
    double mean_step_s = 0;
    model_->train();
    while (step_ < c.train.max_steps) {
      auto t0 = Clock::now();
      flat_->zero_grad();
      torch::Tensor loss_sum = torch::zeros({}, torch::TensorOptions().device(device_));
      for (int64_t micro = 0; micro < accum; ++micro) {
        auto b = next_batch(*train_reader_, B, T, buf, device_);
        auto loss = model_->loss(b.x, b.y);
        (loss / static_cast<double>(accum)).backward();
        loss_sum += loss.detach();
      }
      auto gnorm = clip_grad_norm(*flat_, c.optim.grad_clip);
      const double lr = lr_at(c.schedule, c.optim.lr, c.train.max_steps, step_);
      opt_->step(lr);
      if (ema_.defined()) ema_.lerp_(flat_->params(), 1.0 - c.train.ema_decay);
      const double loss = loss_sum.item<double>() / accum;  // the host sync of the step
      const double step_s = seconds_since(t0);
      if (!std::isfinite(loss)) throw Error(strf("non-finite loss %g at step %lld", loss, (long long)step_ + 1));
      ++step_;
      tokens_ += tokens_per_step;
      mean_step_s = mean_step_s == 0 ? step_s : 0.9 * mean_step_s + 0.1 * step_s;
      win_.loss += loss;
      win_.time += step_s;
      ++win_.steps;
      if (step_ > start_step_ + 1) win_.timed_tokens += tokens_per_step, win_.timed_s += step_s;
      if (step_ == start_step_ + 1 && !resume_dir_.empty())
        metrics_->write({{"kind", "resume"}, {"step", step_}, {"checkpoint", resume_dir_},
                         {"recovery_ms", 1e3 * process_age_s()}, {"load_ms", load_ms_}});
      if (step_ % c.log.every_steps == 0 || step_ == c.train.max_steps) log_window(lr, gnorm.item<double>(), tokens_per_step);
      if (val_reader_ && c.eval.every_steps > 0 && step_ % c.eval.every_steps == 0 && step_ != c.train.max_steps)
        evaluate();
      log_saves();
      if (g_stop_signal.load() != 0) {
        log::warn(strf("signal %d: checkpointing at step %lld and stopping", g_stop_signal.load(), (long long)step_));
        save();
        ckpt_->wait();
        log_saves();
        return summary(t_start);
      }
      if (step_ != c.train.max_steps && ckpt_->due(step_, mean_step_s)) save();
    }
    if (val_reader_) evaluate();
    if (ckpt_->last_save_step() != step_) save();  // always one at the end
    ckpt_->wait();
    log_saves();
    save_safetensors(c.run.dir + "/model.safetensors", module_tensors(*model_),
                     {{"format", "pt"}, {"arch", c.model.arch}, {"step", std::to_string(step_)}});
    return summary(t_start);
  }

 private:
  // A checkpoint trained with another architecture or on other data is refused unless forced.
  void check_compatible() {
    if (resume_dir_.empty()) return;
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
    st.state = {{"progress", {{"step", step_}, {"tokens", tokens_}, {"epoch", train_reader_->epoch()}}},
                {"optimizer", {{"kind", "adamw"}, {"step", opt_->steps()}}},
                {"scheduler", {{"kind", cfg_.schedule.kind}, {"step", step_}, {"lr", lr_at(cfg_.schedule, cfg_.optim.lr, cfg_.train.max_steps, step_)}}},
                {"metrics", win_.to_json()},
                {"config", to_yaml(cfg_)},
                {"arch", arch_json(cfg_.model, vocab_)},
                {"data_version", manifest_.data_version},
                {"code", {{"commit", build_git_commit()}, {"dirty", build_git_dirty()}}}};
    st.model = module_tensors(*model_);
    for (const auto& e : flat_->entries()) {
      st.optimizer.emplace_back("exp_avg/" + e.name, opt_->exp_avg().narrow(0, e.offset, e.numel));
      st.optimizer.emplace_back("exp_avg_sq/" + e.name, opt_->exp_avg_sq().narrow(0, e.offset, e.numel));
      if (ema_.defined()) st.ema.emplace_back(e.name, ema_.narrow(0, e.offset, e.numel));
    }
    st.rank_state = {{"rank", 0},
                     {"loader", nlohmann::json::object()},
                     {"rng", {{"cpu", to_hex(at::detail::getDefaultCPUGenerator().get_state())}}}};
    return st;
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
    // Data position: the foundation reader replays its windows.
    for (int64_t i = 0; i < step_ * cfg_.train.grad_accum; ++i) {
      std::vector<int64_t> buf;
      train_reader_->next(cfg_.train.micro_batch_size, buf);
    }
    if (st.rank_state.contains("rng")) {
      at::Generator gen = at::detail::getDefaultCPUGenerator();  // a handle on the shared generator
      gen.set_state(from_hex(st.rank_state.at("rng").at("cpu").get<std::string>()));
    }
    if (!st.rank_state.contains("rng")) log::warn(resume_dir_ + ": no RNG state for this rank; dropout draws start anew");
    load_ms_ = 1e3 * seconds_since(t0);
    log::info(strf("resumed from %s at step %lld (%.0f ms)", resume_dir_.c_str(), (long long)step_, load_ms_));
  }

  void log_window(double lr, double gnorm, int64_t tokens_per_step) {
    const double mean_loss = win_.loss / win_.steps, tps = tokens_per_step * win_.steps / win_.time;
    const double step_ms = 1e3 * win_.time / win_.steps;
    log::info(strf("step %6lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.1f ms/step",
                   (long long)step_, (long long)cfg_.train.max_steps, mean_loss, lr, gnorm, tps, step_ms));
    metrics_->write({{"kind", "train"}, {"step", step_}, {"loss", mean_loss}, {"lr", lr},
                     {"grad_norm", gnorm}, {"tokens_per_s", tps}, {"step_ms", step_ms},
                     {"tokens", tokens_}, {"epoch", train_reader_->epoch()}});
    if (win_.first_loss < 0) win_.first_loss = mean_loss;
    win_.last_loss = mean_loss;
    win_.loss = win_.time = 0;
    win_.steps = 0;
  }

  void log_saves() {
    for (auto& r : ckpt_->finished()) {
      if (!r.error.empty()) {
        log::error("checkpoint at step " + std::to_string(r.step) + " failed: " + r.error);
        if (cfg_.checkpoint.on_error == "stop") throw Error("checkpoint at step " + std::to_string(r.step) + " failed: " + r.error);
        continue;
      }
      const double mbps = r.write_ms > 0 ? r.mb / (r.write_ms / 1e3) : 0;
      log::info(strf("checkpoint %s: %.1f MB, blocked %.0f ms, written in %.0f ms (%.0f MB/s)%s", r.dir.c_str(),
                     r.mb, r.block_ms, r.write_ms, mbps, r.async ? ", async" : ""));
      metrics_->write({{"kind", "checkpoint"}, {"step", r.step}, {"dir", r.dir}, {"async", r.async},
                       {"ckpt_block_ms", r.block_ms}, {"ckpt_write_ms", r.write_ms}, {"ckpt_mb", r.mb},
                       {"ckpt_mb_per_s", mbps}});
    }
  }

  // Mean loss over eval.batches validation micro-batches, always the same ones (reader reset);
  // with EMA also the loss of the EMA weights.
  void evaluate() {
    auto mean_loss = [&] {
      torch::NoGradGuard ng;
      model_->eval();
      val_reader_->reset();
      std::vector<int64_t> buf;
      double total = 0;
      for (int64_t i = 0; i < cfg_.eval.batches; ++i) {
        auto b = next_batch(*val_reader_, cfg_.train.micro_batch_size, cfg_.model.seq_len, buf, device_);
        total += model_->loss(b.x, b.y).item<double>();
      }
      model_->train();
      return total / cfg_.eval.batches;
    };
    const double loss = mean_loss();
    nlohmann::json rec = {{"kind", "val"}, {"step", step_}, {"val_loss", loss}};
    std::string ema_text;
    if (ema_.defined()) {
      torch::NoGradGuard ng;
      auto saved = flat_->params().clone();
      flat_->params().copy_(ema_);
      rec["val_loss_ema"] = mean_loss();
      flat_->params().copy_(saved);
      ema_text = strf(" | ema %.4f", rec["val_loss_ema"].get<double>());
    }
    val_loss_ = loss;
    log::info(strf("step %6lld | val loss %.4f%s", (long long)step_, loss, ema_text.c_str()));
    metrics_->write(rec);
  }

  TrainSummary summary(Clock::time_point t_start) {
    TrainSummary sum;
    sum.steps = step_;
    sum.first_loss = win_.first_loss;
    sum.last_loss = win_.last_loss;
    sum.val_loss = val_loss_;
    sum.wall_s = seconds_since(t_start);
    sum.tokens_per_s = win_.timed_s > 0 ? win_.timed_tokens / win_.timed_s : 0;
    log::info(strf("done: %lld steps in %.1f s | loss %.4f -> %.4f | val loss %.4f | %.0f tok/s",
                   (long long)sum.steps, sum.wall_s, sum.first_loss, sum.last_loss, sum.val_loss,
                   sum.tokens_per_s));
    fs::write_file_atomic(cfg_.run.dir + "/summary.json",
                          nlohmann::json{{"steps", sum.steps}, {"first_loss", sum.first_loss},
                                         {"last_loss", sum.last_loss}, {"val_loss", sum.val_loss},
                                         {"tokens_per_s", sum.tokens_per_s}, {"wall_s", sum.wall_s}}
                                  .dump(2) + "\n");
    return sum;
  }

  ExperimentConfig cfg_;
  torch::Device device_;
  data::Manifest manifest_, val_manifest_;
  std::unique_ptr<data::SequentialReader> train_reader_, val_reader_;
  int64_t vocab_ = 0;
  double flops_per_token_ = 0;
  GPT model_{nullptr};
  std::unique_ptr<FlatParams> flat_;
  std::unique_ptr<AdamW> opt_;
  torch::Tensor ema_;  // flat EMA of flat_->params(), when train.ema_decay > 0
  std::unique_ptr<Checkpointer> ckpt_;
  std::string resume_dir_;
  CheckpointState resume_state_;
  std::unique_ptr<MetricsFile> metrics_;
  int64_t step_ = 0, start_step_ = 0, tokens_ = 0;
  double load_ms_ = 0, val_loss_ = -1;
  Windows win_;
};

const char* kUsage =
    "usage: trainer CONFIG.yaml [dotted.key=value ...]\n"
    "  Trains the experiment described by CONFIG.yaml; overrides beat the file.\n";

}  // namespace

TrainSummary train(const ExperimentConfig& cfg, const std::string& command) {
  Trainer t(cfg, command);
  return t.run();
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
