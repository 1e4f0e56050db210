// Metrics sinks on a background thread (see metrics.h).
#include "trainer/telemetry/metrics.h"

#include <pthread.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "run/run_dir.h"
#include "run/records.h"
#include "trainer/telemetry/tensorboard.h"

namespace lm {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Keeps the lines of `path` whose step is <= keep (a resume drops what came after its checkpoint;
// a line cut by a crash is dropped too).
void truncate_after(const std::string& path, int64_t keep) {
  std::string kept;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) continue;
    if (j.value(records::kStep, int64_t{0}) <= keep) kept += line + "\n";
  }
  files::write_file_atomic(path, kept);
}

uint64_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<uint64_t>(n);
}

// Numeric fields worth a TensorBoard scalar, per record kind.
const char* const kTrainScalars[] = {records::kLoss, records::kZLoss, records::kLr, records::kGradNorm, records::kTokensPerS, records::kTokensPerSRank, records::kStepMs,
                                     records::kDataWaitPct, records::kMfuPct, records::kMemMb, records::kPaddingPct,
                                     records::kCpuStealPct};

}  // namespace

std::string duration_text(double s) {
  if (!(s >= 0) || s > 1e8) return "?";
  const auto t = static_cast<long long>(s + 0.5);
  return t >= 3600 ? strf("%lldh%02lldm", t / 3600, t % 3600 / 60) : strf("%lldm%02llds", t / 60, t % 60);
}

MetricsSink::MetricsSink(const Options& opt) : opt_(opt) {
  const std::string path = run_dir::metrics(opt.run_dir);
  if (opt.keep_through_step >= 0) truncate_after(path, opt.keep_through_step);
  jsonl_ = std::fopen(path.c_str(), opt.keep_through_step >= 0 ? "a" : "w");
  if (!jsonl_) throw Error(path + ": cannot open for writing");
  if (opt.tensorboard) {
    tb_ = std::make_unique<TensorBoardWriter>(opt.run_dir);
    // A resume: TensorBoard drops the points the crashed attempt logged past the checkpoint.
    if (opt.keep_through_step >= 0) tb_->session_start(opt.keep_through_step + 1, now_s());
  }
  bar_ = opt.console && ::isatty(STDERR_FILENO);
  jsonl_good_ = static_cast<uint64_t>(std::ftell(jsonl_));
  if (tb_) tb_good_ = file_size_or_zero(tb_->path());
  thread_ = std::thread([this] { run(); });
}

MetricsSink::~MetricsSink() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (bar_) std::fputs("\n", stderr);
  if (jsonl_) std::fclose(jsonl_);
}

std::string MetricsSink::take_error() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string e;
  e.swap(error_);
  return e;
}

// A failed file: cut back to its last complete record (nothing half-written stays) and closed; the
// next batch opens it again (TensorBoard: a new events file). The error goes to the training
// thread (take_error) once per failing spell: a later batch that succeeds ends the spell.
void MetricsSink::fail(const std::string& what) {
  if (jsonl_ && what.rfind(run_dir::metrics(opt_.run_dir), 0) == 0) {
    std::fclose(jsonl_);  // may still push part of its buffer: cut below
    jsonl_ = nullptr;
    if (::truncate(run_dir::metrics(opt_.run_dir).c_str(), static_cast<off_t>(jsonl_good_)) != 0) {}
  } else if (tb_ && what.rfind(tb_->path(), 0) == 0) {
    const std::string path = tb_->path();
    tb_.reset();
    if (::truncate(path.c_str(), static_cast<off_t>(tb_good_)) != 0) {}
  }
  if (failing_) return;
  failing_ = true;
  std::lock_guard<std::mutex> lock(mu_);
  if (error_.empty()) error_ = "metrics: " + what;
}

// Files closed by fail() are opened again (appending; TensorBoard starts a new file).
void MetricsSink::reopen() {
  const std::string path = run_dir::metrics(opt_.run_dir);
  if (!jsonl_ && !(jsonl_ = std::fopen(path.c_str(), "a"))) throw Error(path + ": cannot open for writing (" + std::strerror(errno) + ")");
  if (opt_.tensorboard && !tb_) {
    tb_ = std::make_unique<TensorBoardWriter>(opt_.run_dir);
    tb_good_ = file_size_or_zero(tb_->path());
  }
}

void MetricsSink::write_batch(const std::deque<nlohmann::json>& batch) {
  const std::string path = run_dir::metrics(opt_.run_dir);
  try {
    if (failing_) reopen();
    for (const auto& rec : batch) handle(rec);
    if (jsonl_ && std::fflush(jsonl_) != 0) throw Error(path + ": write failed (" + std::strerror(errno) + ")");
    if (jsonl_) jsonl_good_ = static_cast<uint64_t>(std::ftell(jsonl_));
    if (tb_) {
      tb_->flush();
      tb_good_ = file_size_or_zero(tb_->path());
    }
    failing_ = false;
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

void MetricsSink::write(nlohmann::json rec) {
  const auto t0 = std::chrono::steady_clock::now();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(rec));
    caller_ms_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  cv_.notify_one();
}

void MetricsSink::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

double MetricsSink::caller_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return caller_ms_;
}

double MetricsSink::sink_cpu_ms() const {
  clockid_t clock;
  timespec ts{};
  if (pthread_getcpuclockid(const_cast<std::thread&>(thread_).native_handle(), &clock) != 0 ||
      clock_gettime(clock, &ts) != 0)
    return 0;
  return 1e3 * static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e6;
}

void MetricsSink::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_) break;
    std::deque<nlohmann::json> batch;
    batch.swap(queue_);
    busy_ = true;
    lock.unlock();
    write_batch(batch);
    lock.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
  idle_cv_.notify_all();
}

void MetricsSink::mixture_scalars(const nlohmann::json& rec, int64_t step, double wall) {
  auto w = rec.find(records::kSourceTokens), t = rec.find(records::kSourceTokensTotal);
  if (w == rec.end() || t == rec.end() || !w->is_object() || !t->is_object()) return;
  double total = 0;
  for (const auto& [name, v] : t->items()) total += v.get<double>();
  for (const auto& [name, v] : w->items()) tb_->scalar("data/tokens/" + name, step, v.get<double>(), wall);
  for (const auto& [name, v] : t->items())
    if (total > 0) tb_->scalar("data/share/" + name, step, 100.0 * v.get<double>() / total, wall);
}

void MetricsSink::handle(const nlohmann::json& rec) {
  const std::string line = rec.dump() + "\n";
  if (jsonl_ && std::fwrite(line.data(), 1, line.size(), jsonl_) != line.size())
    throw Error(run_dir::metrics(opt_.run_dir) + ": write failed (" + std::strerror(errno) + ")");
  const std::string kind = rec.value(records::kKind, "");
  const int64_t step = rec.value(records::kStep, int64_t{0});
  const double wall = rec.value(records::kTime, now_s());
  if (tb_) {
    auto scalar = [&](const std::string& tag, const char* key) {
      auto it = rec.find(key);
      if (it != rec.end() && it->is_number()) tb_->scalar(tag, step, it->get<double>(), wall);
    };
    if (kind == records::kTrain) {
      for (const char* key : kTrainScalars) scalar(std::string("train/") + key, key);
      mixture_scalars(rec, step, wall);
    } else if (kind == records::kVal) {
      scalar("val/loss", records::kValLoss);
      scalar("val/loss_ema", records::kValLossEma);
    } else if (kind == records::kTask) {
      const std::string name = rec.value(records::kTaskName, "");
      scalar("task/" + name + "/acc", records::kTaskAcc);
      scalar("task/" + name + "/acc_norm", records::kTaskAccNorm);
    } else if (kind == records::kCheckpoint) {
      scalar("checkpoint/block_ms", records::kCkptBlockMs);
      scalar("checkpoint/write_ms", records::kCkptWriteMs);
      scalar("checkpoint/mb_per_s", records::kCkptMbPerS);
      scalar("checkpoint/steal_ms", records::kCkptStealMs);
    } else if (kind == records::kResume) {
      scalar("resume/recovery_ms", records::kRecoveryMs);
    } else if (kind == records::kLongWindow) {
      for (const char* key : {records::kTokensPerSMean, records::kTokensPerSMin, records::kTokensPerSMax, records::kMfuPctMean,
                              records::kMfuPctMin, records::kMfuPctMax})
        scalar(std::string("window/") + key, key);
    }
  }
  if (opt_.console && (kind == records::kTrain || kind == records::kVal || kind == records::kTask || kind == records::kLongWindow))
    console_line(rec);
  if (kind == records::kTrain) long_window(rec);
}

void MetricsSink::console_line(const nlohmann::json& rec) {
  const std::string kind = rec.value(records::kKind, "");
  auto num = [&](const char* key) { return rec.value(key, 0.0); };
  std::string text;
  if (kind == records::kTrain) {
    text = strf("step %6lld/%lld | loss %.4f | lr %.3e | grad norm %.3f | %.0f tok/s | %.1f ms/step | data wait %.1f%%",
                (long long)rec.value(records::kStep, int64_t{0}), (long long)opt_.total_steps, num(records::kLoss), num(records::kLr),
                num(records::kGradNorm), num(records::kTokensPerS), num(records::kStepMs), num(records::kDataWaitPct));
    if (rec.contains(records::kMfuPct) && rec[records::kMfuPct].is_number()) text += strf(" | MFU %.1f%%", num(records::kMfuPct));
    if (rec.contains(records::kZLoss)) text += strf(" | z-loss %.4g", num(records::kZLoss));
    if (rec.contains(records::kPaddingPct)) text += strf(" | padding %.1f%%", num(records::kPaddingPct));
  } else if (kind == records::kVal) {
    text = strf("step %6lld | val loss %.4f", (long long)rec.value(records::kStep, int64_t{0}), num(records::kValLoss));
    if (rec.contains(records::kValLossEma)) text += strf(" | ema %.4f", num(records::kValLossEma));
  } else if (kind == records::kTask) {
    text = strf("step %6lld | task %s | acc %.1f%% | acc_norm %.1f%% | %lld examples",
                (long long)rec.value(records::kStep, int64_t{0}), rec.value(records::kTaskName, "").c_str(),
                100 * num(records::kTaskAcc), 100 * num(records::kTaskAccNorm),
                (long long)rec.value(records::kTaskExamples, int64_t{0}));
  } else {
    text = strf("last %.0f s: %.0f tok/s (min %.0f, max %.0f)", num(records::kWindowS), num(records::kTokensPerSMean),
                num(records::kTokensPerSMin), num(records::kTokensPerSMax));
    if (rec.contains(records::kMfuPctMean)) text += strf(", MFU %.1f%%", num(records::kMfuPctMean));
  }
  if (bar_) std::fputs("\r\033[K", stderr);  // clear the bar, print the line above it
  log::info(text);
  if (bar_ && kind == records::kTrain && opt_.total_steps > 0) {
    const int64_t step = rec.value(records::kStep, int64_t{0});
    const double frac = std::min(1.0, static_cast<double>(step) / opt_.total_steps);
    const int width = 30, full = static_cast<int>(frac * width);
    const double eta = (opt_.total_steps - step) * num(records::kStepMs) / 1e3;
    std::fprintf(stderr, "[%s%s] %3.0f%% step %lld/%lld | ETA %s", std::string(full, '#').c_str(),
                 std::string(width - full, '.').c_str(), 100 * frac, (long long)step, (long long)opt_.total_steps,
                 duration_text(eta).c_str());
    std::fflush(stderr);
  }
}

void MetricsSink::long_window(const nlohmann::json& rec) {
  const double wall = rec.value(records::kTime, now_s());
  double tps = rec.value(records::kTokensPerS, 0.0);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (win_last_wall_ >= 0) win_elapsed_ += std::max(0.0, wall - win_last_wall_);
    win_last_wall_ = wall;
    win_tps_min_ = win_n_ ? std::min(win_tps_min_, tps) : tps;
    win_tps_max_ = win_n_ ? std::max(win_tps_max_, tps) : tps;
    win_tps_sum_ += tps;
    ++win_n_;
    if (rec.contains(records::kMfuPct) && rec[records::kMfuPct].is_number()) {
      const double m = rec[records::kMfuPct].get<double>();
      win_mfu_min_ = win_mfu_n_ ? std::min(win_mfu_min_, m) : m;
      win_mfu_max_ = win_mfu_n_ ? std::max(win_mfu_max_, m) : m;
      win_mfu_sum_ += m;
      ++win_mfu_n_;
    }
    if (win_elapsed_ < opt_.long_window_s) return;
  }
  nlohmann::json w = {{records::kKind, records::kLongWindow}, {records::kStep, rec.value(records::kStep, int64_t{0})}, {records::kTime, wall},
                      {records::kWindowS, win_elapsed_}, {records::kStepsLogged, win_n_},
                      {records::kTokensPerSMean, win_tps_sum_ / win_n_}, {records::kTokensPerSMin, win_tps_min_},
                      {records::kTokensPerSMax, win_tps_max_}};
  if (win_mfu_n_ > 0) {
    w[records::kMfuPctMean] = win_mfu_sum_ / win_mfu_n_;
    w[records::kMfuPctMin] = win_mfu_min_;
    w[records::kMfuPctMax] = win_mfu_max_;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    win_elapsed_ = win_tps_sum_ = win_mfu_sum_ = 0;
    win_n_ = win_mfu_n_ = 0;
  }
  handle(w);
}

nlohmann::json MetricsSink::window_state() {
  flush();
  std::lock_guard<std::mutex> lock(mu_);
  return {{"elapsed_s", win_elapsed_}, {"n", win_n_}, {"tps_sum", win_tps_sum_}, {"tps_min", win_tps_min_},
          {"tps_max", win_tps_max_}, {"mfu_n", win_mfu_n_}, {"mfu_sum", win_mfu_sum_}, {"mfu_min", win_mfu_min_},
          {"mfu_max", win_mfu_max_}};
}

void MetricsSink::load_window_state(const nlohmann::json& j) {
  std::lock_guard<std::mutex> lock(mu_);
  win_elapsed_ = j.value("elapsed_s", 0.0);
  win_n_ = j.value("n", int64_t{0});
  win_tps_sum_ = j.value("tps_sum", 0.0), win_tps_min_ = j.value("tps_min", 0.0), win_tps_max_ = j.value("tps_max", 0.0);
  win_mfu_n_ = j.value("mfu_n", int64_t{0});
  win_mfu_sum_ = j.value("mfu_sum", 0.0), win_mfu_min_ = j.value("mfu_min", 0.0), win_mfu_max_ = j.value("mfu_max", 0.0);
  win_last_wall_ = -1;  // the time between the crash and the resume is not training time
}

}  // namespace lm
