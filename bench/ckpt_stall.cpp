// ckpt_stall: the real stall of a checkpoint save inside a training loop, not the time of the
// save() call. A GPT (default GPT-2 124M: parameters + AdamW moments = 1.5 GB of state, + 0.5 GB
// with --ema) trains on random tokens exactly as trainer/train.cpp steps it (the optimizer and EMA fenced by the checkpointer before
// the update, step_done after the step). Rounds alternate the save modes in rotating order; each
// round runs --clean steps with no save, then a save, then steps until the save is over and one
// more. The stall of a save = its save() call + the extra time of the steps after it over the
// round's median step without a save.
//
//   ckpt_stall --dir DIR [--rounds N] [--modes sync,thread,nowrite] [--ema] [--layers L] [--seq T]
//              [--no-prepare]
// Mode nowrite is the async save with its staged images' disk writes discarded (see
// DiscardDirectWrites): what the save costs training apart from the disk.
// With OPENBLAS_NUM_THREADS=1 training leaves the writer a CPU of its own, as a GPU host does.
// prints one JSON line per save and a summary line (medians over rounds):
//   <mode>_stall_ms        measured stall (sync: the whole save)
//   <mode>_reported_ms     what the Checkpointer reported as block_ms (ckpt_block_ms in metrics)
//   <mode>_peak_extra_mb   peak RSS of this process during the save over the RSS
//                          before it (the staging buffer is allocated at start, or with
//                          --no-prepare in the first save, and kept)
//   <mode>_pct_of_sync     stall as a percentage of the synchronous save's
//   <mode>_first_stall_ms  the stall of the mode's first save (round 0), which the medians leave
//                          out: without Checkpointer::prepare() (--no-prepare) the first async
//                          save allocates its staging buffer and takes its page faults
//   <mode>_steal_ms        CPU time the hypervisor took from this machine's CPUs (/proc/stat
//                          steal, all CPUs) from the save to the end of the steps after it, over
//                          the rate of the steps without a save: on a VM the host's side of the
//                          disk writes can run on our cores; the stall includes what it delays
// The forked writer (the previous design) was compared with this loop in commit 223b6ab (mode
// "fork"); it stalled longer and was removed.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "models/gpt.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/checkpoint/state.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/ema.h"
#include "trainer/runtime/host_allocator.h"

namespace {
using Clock = std::chrono::steady_clock;
using lm::clock::ms_since;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Resident memory of this process, in MB (/proc/self/statm: O(1), unlike smaps_rollup, whose
// page-table walk of a 4 GB process every 25 ms took 7% of the CPU and landed in the stall). The
// writer is a thread, so the process is the whole of the save's memory.
double rss_mb() {
  std::ifstream in("/proc/self/statm");
  double pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<double>(::sysconf(_SC_PAGESIZE)) / (1 << 20);
}

// The POSIX file system, except that while `discard` is set, writes to files in direct mode (the
// async save's staged images) are counted as written and never reach the disk: mode "nowrite"
// measures the stall of the save without its disk writes (the staging copy, the checksums, the
// small files), to tell the trainer's part from the host's.
class DiscardDirectWrites : public lm::files::FileSystem {
 public:
  bool discard = false;  // set only between saves (no write in flight)
  int set_direct(int fd, bool on) override {
    if (int e = FileSystem::set_direct(fd, on); e != 0) return e;
    std::lock_guard<std::mutex> lock(mu_);
    direct_[fd] = on;
    return 0;
  }
  int write(int fd, const void* data, size_t n, size_t* written) override {
    if (discard && is_direct(fd)) return *written = n, 0;
    return FileSystem::write(fd, data, n, written);
  }
  int close(int fd) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      direct_.erase(fd);
    }
    return FileSystem::close(fd);
  }

 private:
  bool is_direct(int fd) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = direct_.find(fd);
    return it != direct_.end() && it->second;
  }
  std::mutex mu_;
  std::map<int, bool> direct_;
};

// Samples rss_mb() every 25 ms while on; peak() since the last reset.
class PeakSampler {
 public:
  PeakSampler() : thread_([this] {
      while (!stop_) {
        if (on_) peak_ = std::max(peak_.load(), rss_mb());
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
      }
    }) {}
  ~PeakSampler() { stop_ = true, thread_.join(); }
  void start() { peak_ = rss_mb(), on_ = true; }
  double stop() { on_ = false; return std::max(peak_.load(), rss_mb()); }

 private:
  std::atomic<bool> stop_{false}, on_{false};
  std::atomic<double> peak_{0};
  std::thread thread_;
};

struct Model {
  lm::GPT gpt{nullptr};
  std::unique_ptr<lm::FlatParams> flat;
  std::unique_ptr<lm::AdamW> opt;
  std::unique_ptr<lm::Ema> ema;
  torch::Tensor x, y;
  std::unique_ptr<lm::ModuleState> model_state;
  lm::StateRegistry registry;
};

// One training step as the trainer takes it; its seconds.
double step(Model& m, lm::Checkpointer* ck) {
  m.opt->set_fence(ck);  // the checkpointer in use fences the updates, as the trainer's does
  if (m.ema) m.ema->set_fence(ck);
  const auto t0 = Clock::now();
  m.flat->zero_grad();
  m.gpt->loss_sum(m.x, m.y).div(m.x.numel()).backward();
  lm::clip_grad_norm(*m.flat, 1.0);
  m.opt->step(1e-4);  // asks the checkpointer first (set_fence)
  if (m.ema) m.ema->update();
  const double s = ms_since(t0) / 1e3;
  ck->step_done(s);
  return s;
}

// GPT-2 with `layers` layers (d 768), AdamW (and EMA), one random batch of (1, seq), the registry.
void build(Model& m, int layers, int seq, bool ema) {
  lm::ModelConfig mc;
  mc.n_layer = layers, mc.n_head = 12, mc.d_model = 768, mc.seq_len = seq;
  torch::manual_seed(0);
  m.gpt = lm::GPT(mc, lm::padded_vocab(mc, 50257));
  m.flat = std::make_unique<lm::FlatParams>(*m.gpt);
  m.opt = std::make_unique<lm::AdamW>(*m.flat, lm::OptimConfig{});
  if (ema) m.ema = std::make_unique<lm::Ema>(*m.flat, 0.999);
  m.x = torch::randint(50257, {1, seq}, torch::kLong), m.y = torch::randint(50257, {1, seq}, torch::kLong);
  using Scope = lm::StateRegistry::Scope;
  m.model_state = std::make_unique<lm::ModuleState>(*m.gpt, "model");
  m.registry.add(lm::state_key::kModel, Scope::kReplicated, *m.model_state);
  m.registry.add(lm::state_key::kOptimizer, Scope::kReplicated, *m.opt);
  if (ema) m.registry.add(lm::state_key::kEma, Scope::kReplicated, *m.ema);
}

// One save and the steps until it is over, then one more.
struct SaveRun {
  double call_ms = 0, peak_mb = 0, steal_ms = 0, window_s = 0;  // peak: RSS; steal: whole window
  std::vector<double> after_s;                                    // the steps' seconds
  lm::SaveReport report;
};

SaveRun measure_save(Model& m, lm::Checkpointer* ck, int64_t n, PeakSampler& sampler, const std::string& mode) {
  SaveRun run;
  sampler.start();
  const auto t0 = Clock::now();
  lm::clock::StealMeter steal;  // on a VM, the host's side of a disk write can run on our cores
  ck->save(m.registry.snapshot(n, nlohmann::json::object()));
  run.call_ms = ms_since(t0);
  std::vector<lm::SaveReport> reps;
  for (int extra = 1; extra > 0;) {
    run.after_s.push_back(step(m, ck));
    for (auto& rep : ck->finished()) reps.push_back(rep);
    if (!reps.empty()) --extra;
  }
  run.peak_mb = sampler.stop();
  run.steal_ms = 1e3 * steal.take_s(), run.window_s = ms_since(t0) / 1e3;
  if (reps.empty() || !reps[0].error.empty()) throw lm::Error(mode + " save failed: " + (reps.empty() ? "" : reps[0].error));
  run.report = reps[0];
  return run;
}

using PerMode = std::map<std::string, std::vector<double>>;

std::vector<std::string> parse_modes(const std::string& arg) {
  std::vector<std::string> modes;
  std::stringstream ss(arg);
  for (std::string m; std::getline(ss, m, ',');) {
    if (m != "sync" && m != "thread" && m != "nowrite") throw lm::UsageError("--modes: unknown mode '" + m + "'");
    modes.push_back(m);
  }
  return modes;
}

// The summary line: medians over rounds per mode, and each stall as a percentage of the sync save's.
void print_summary(const std::vector<std::string>& modes, PerMode& stall, PerMode& reported, PerMode& peak,
                   PerMode& steal, double state_mb, int rounds, double step_ms, double base_mb) {
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  nlohmann::json out = {{"state_mb", state_mb}, {"rounds", rounds}, {"step_ms", step_ms},
                        {"blas_threads", blas ? blas : "default"}, {"intra_op_threads", torch::get_num_threads()},
                        {"rss_mb_before_save", base_mb}};
  const double sync = stall.count("sync") ? median(stall["sync"]) : 0;
  for (auto& mode : modes) {
    out[mode + "_stall_ms"] = median(stall[mode]);
    out[mode + "_reported_ms"] = median(reported[mode]);
    out[mode + "_peak_extra_mb"] = median(peak[mode]);
    out[mode + "_steal_ms"] = median(steal[mode]);
    out[mode + "_first_stall_ms"] = stall[mode].front();  // the first save of a Checkpointer
    if (sync > 0) out[mode + "_pct_of_sync"] = 100.0 * median(stall[mode]) / sync;
  }
  std::cout << out.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  return lm::run_main("ckpt_stall", [&] {
    CLI::App app{"real stall of checkpoint saves in a training loop"};
    std::string dir, modes_arg = "sync,thread,nowrite";
    int rounds = 4, clean = 2, layers = 12, seq = 64;
    bool ema = false, no_prepare = false;
    app.add_option("--dir", dir, "scratch directory on the disk to measure")->required();
    app.add_option("--rounds", rounds, "rounds (each saves once per mode)");
    app.add_option("--clean", clean, "steps without a save before each save");
    app.add_option("--modes", modes_arg, "comma-separated: sync, thread, nowrite");
    app.add_option("--layers", layers, "GPT-2 layers (d 768)");
    app.add_option("--seq", seq, "tokens per step (batch 1)");
    app.add_flag("--ema", ema, "also keep (and save) an EMA of the weights");
    app.add_flag("--no-prepare", no_prepare, "no Checkpointer::prepare() at start (the first async save allocates)");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);
      throw lm::UsageError(e.what());
    }
    const std::vector<std::string> modes = parse_modes(modes_arg);
    lm::install_caching_host_allocator();
    DiscardDirectWrites fs;
    lm::files::set_file_system(&fs);
    Model m;
    build(m, layers, seq, ema);
    std::map<std::string, std::unique_ptr<lm::Checkpointer>> cks;
    for (auto& mode : modes) {
      lm::CheckpointConfig cc;
      cc.async = mode != "sync", cc.keep_last = 1;
      lm::files::remove_all(dir + "/" + mode);
      cks[mode] = std::make_unique<lm::Checkpointer>(cc, dir + "/" + mode, 0, 1);
    }
    PeakSampler sampler;
    PerMode stall, reported, peak, steal;
    double state_mb = 0, base_mb = 0;
    std::vector<double> all_clean;
    if (!no_prepare)  // as the trainer does at start: the staging buffers, faulted in in the background
      for (auto& [mode, ck] : cks) ck->prepare(m.registry.snapshot(0, nlohmann::json::object()));
    for (int w = 0; w < 2; ++w) step(m, cks[modes[0]].get());  // warm-up
    int64_t n = 0;
    for (int r = 0; r < rounds; ++r) {
      std::map<std::string, std::vector<double>> after;
      std::map<std::string, double> call_ms;
      std::vector<double> clean_s;
      std::map<std::string, double> window_steal, window_s;
      double clean_steal = 0, clean_total_s = 0;
      for (size_t i = 0; i < modes.size(); ++i) {
        const std::string& mode = modes[(i + r) % modes.size()];
        lm::Checkpointer* ck = cks[mode].get();
        lm::clock::StealMeter clean_meter;
        for (int c = 0; c < clean; ++c) clean_s.push_back(step(m, ck)), clean_total_s += clean_s.back();
        clean_steal += 1e3 * clean_meter.take_s();
        base_mb = rss_mb();
        fs.discard = mode == "nowrite";
        const SaveRun run = measure_save(m, ck, ++n, sampler, mode);
        call_ms[mode] = run.call_ms, after[mode] = run.after_s;
        peak[mode].push_back(run.peak_mb - base_mb);
        window_steal[mode] = run.steal_ms, window_s[mode] = run.window_s;
        reported[mode].push_back(run.report.block_ms);
        state_mb = run.report.mb;
      }
      const double base_s = median(clean_s);
      all_clean.insert(all_clean.end(), clean_s.begin(), clean_s.end());
      for (auto& [mode, steps] : after) {
        double extra_ms = 0;
        for (double s : steps) extra_ms += 1e3 * (s - base_s);
        stall[mode].push_back(call_ms[mode] + std::max(0.0, extra_ms));
        steal[mode].push_back(std::max(0.0, window_steal[mode] - clean_steal / clean_total_s * window_s[mode]));
        std::cout << nlohmann::json{{"round", r}, {"mode", mode}, {"call_ms", call_ms[mode]},
                                    {"after_steps_s", steps}, {"base_step_ms", 1e3 * base_s},
                                    {"stall_ms", stall[mode].back()}, {"reported_ms", reported[mode].back()},
                                    {"peak_extra_mb", peak[mode].back()}, {"steal_ms", steal[mode].back()}}.dump() << std::endl;
      }
    }
    print_summary(modes, stall, reported, peak, steal, state_mb, rounds, 1e3 * median(all_clean), base_mb);
    for (auto& mode : modes) lm::files::remove_all(dir + "/" + mode);
    lm::files::set_file_system(nullptr);
    return 0;
  });
}
