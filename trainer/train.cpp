// The training loop (see train.h).
#include "trainer/train.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>

#include "data/manifest.h"
#include "data/reader.h"
#include "models/gpt.h"
#include "trainer/compat.h"
#include "trainer/cli.h"
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

torch::Device pick_device(const std::string& want) {
  if (want == "cuda" || (want == "auto" && torch::cuda::is_available())) {
    if (!torch::cuda::is_available()) throw ConfigError("key 'train.device': cuda requested but LibTorch has no CUDA device");
    return torch::Device(torch::kCUDA, 0);
  }
  return torch::Device(torch::kCPU);
}

// Appends one JSON object per line to RUN_DIR/metrics.jsonl, flushed per record.
class MetricsFile {
 public:
  explicit MetricsFile(const std::string& path) : out_(path, std::ios::trunc) {
    if (!out_) throw Error(path + ": cannot open for writing");
  }
  void write(const nlohmann::json& rec) {
    out_ << rec.dump() << '\n';
    out_.flush();
  }

 private:
  std::ofstream out_;
};

// (B, T+1) token windows from a reader -> inputs (B, T) and targets (B, T) on `device`.
struct Batch {
  torch::Tensor x, y;
};
Batch next_batch(data::SequentialReader& r, int64_t B, int64_t T, std::vector<int64_t>& buf,
                 const torch::Device& device) {
  r.next(B, buf);
  auto w = torch::from_blob(buf.data(), {B, T + 1}, torch::kLong).to(device, /*non_blocking=*/false, /*copy=*/true);
  return {w.slice(1, 0, T), w.slice(1, 1, T + 1)};
}

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
    vocab_ = padded_vocab(cfg.model, data_vocab);
    model_ = GPT(cfg.model, vocab_);
    model_->to(device_);
    flat_ = std::make_unique<FlatParams>(*model_);
    opt_ = std::make_unique<AdamW>(*flat_, cfg.optim);
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
    metrics_ = std::make_unique<MetricsFile>(run_dir + "/metrics.jsonl");
  }

  TrainSummary run() {
    const auto& c = cfg_;
    const int64_t B = c.train.micro_batch_size, T = c.model.seq_len, accum = c.train.grad_accum;
    const int64_t tokens_per_step = B * T * accum;
    TrainSummary sum;
    auto t_start = Clock::now();
    // Logging window.
    double win_loss = 0, win_time = 0;
    int64_t win_steps = 0;
    double timed_tokens = 0, timed_s = 0;  // steps after the first, for the summary
    bool first_window = true;
    std::vector<int64_t> buf;
    model_->train();
    for (int64_t step = 0; step < c.train.max_steps; ++step) {
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
      const double lr = lr_at(c.schedule, c.optim.lr, c.train.max_steps, step);
      opt_->step(lr);
      const double loss = loss_sum.item<double>() / accum;  // the host sync of the step
      const double step_s = seconds_since(t0);
      if (!std::isfinite(loss)) throw Error(strf("non-finite loss %g at step %lld", loss, (long long)step + 1));
      win_loss += loss;
      win_time += step_s;
      ++win_steps;
      if (step > 0) timed_tokens += tokens_per_step, timed_s += step_s;
      const int64_t done = step + 1;
      if (done % c.log.every_steps == 0 || done == c.train.max_steps) {
        const double mean_loss = win_loss / win_steps, tps = tokens_per_step * win_steps / win_time;
        const double step_ms = 1e3 * win_time / win_steps, gn = gnorm.item<double>();
        log::info(strf("step %6lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.1f ms/step",
                       (long long)done, (long long)c.train.max_steps, mean_loss, lr, gn, tps, step_ms));
        metrics_->write({{"kind", "train"}, {"step", done}, {"loss", mean_loss}, {"lr", lr},
                         {"grad_norm", gn}, {"tokens_per_s", tps}, {"step_ms", step_ms},
                         {"tokens", done * tokens_per_step}, {"epoch", train_reader_->epoch()}});
        if (first_window) sum.first_loss = mean_loss, first_window = false;
        sum.last_loss = mean_loss;
        win_loss = win_time = 0;
        win_steps = 0;
      }
      if (val_reader_ && c.eval.every_steps > 0 && done % c.eval.every_steps == 0 && done != c.train.max_steps)
        sum.val_loss = evaluate(done);
    }
    if (val_reader_) sum.val_loss = evaluate(c.train.max_steps);
    save_safetensors(c.run.dir + "/model.safetensors", module_tensors(*model_),
                     {{"format", "pt"}, {"arch", c.model.arch}, {"step", std::to_string(c.train.max_steps)}});
    sum.steps = c.train.max_steps;
    sum.wall_s = seconds_since(t_start);
    sum.tokens_per_s = timed_s > 0 ? timed_tokens / timed_s : 0;
    log::info(strf("done: %lld steps in %.1f s | loss %.4f -> %.4f | val loss %.4f | %.0f tok/s",
                   (long long)sum.steps, sum.wall_s, sum.first_loss, sum.last_loss, sum.val_loss,
                   sum.tokens_per_s));
    fs::write_file_atomic(c.run.dir + "/summary.json",
                          nlohmann::json{{"steps", sum.steps}, {"first_loss", sum.first_loss},
                                         {"last_loss", sum.last_loss}, {"val_loss", sum.val_loss},
                                         {"tokens_per_s", sum.tokens_per_s}, {"wall_s", sum.wall_s}}
                                  .dump(2) + "\n");
    return sum;
  }

 private:
  // Mean loss over eval.batches validation micro-batches, always the same ones (reader reset).
  double evaluate(int64_t step) {
    torch::NoGradGuard ng;
    model_->eval();
    val_reader_->reset();
    std::vector<int64_t> buf;
    double total = 0;
    const int64_t B = cfg_.train.micro_batch_size, T = cfg_.model.seq_len;
    for (int64_t i = 0; i < cfg_.eval.batches; ++i) {
      auto b = next_batch(*val_reader_, B, T, buf, device_);
      total += model_->loss(b.x, b.y).item<double>();
    }
    model_->train();
    const double loss = total / cfg_.eval.batches;
    log::info(strf("step %6lld | val loss %.4f", (long long)step, loss));
    metrics_->write({{"kind", "val"}, {"step", step}, {"val_loss", loss}});
    return loss;
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
  std::unique_ptr<MetricsFile> metrics_;
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
