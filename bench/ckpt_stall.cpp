// ckpt_stall: the real stall of a checkpoint save inside a training loop, not the time of the
// save() call. A GPT (default GPT-2 124M: parameters + AdamW moments = 1.5 GB of state, + 0.5 GB
// with --ema) trains on random tokens exactly as trainer/train.cpp steps it (the optimizer and EMA fenced by the checkpointer before
// the update, step_done after the step, due() asked after it). Rounds alternate the save modes in
// rotating order; each round runs --clean steps with no save, then a save, then steps until the
// save is over and one more. The stall of a save = its save() call + the extra time of the steps
// after it over the round's median step without a save.
//
//   ckpt_stall --dir DIR [--rounds N] [--modes sync,thread,paced,nowrite] [--ema] [--layers L]
//              [--seq T] [--no-prepare] [--interval STEPS] [--pace SHARE]
// Modes:
//   sync     the trainer's synchronous save (checkpoint.async: false), the baseline: its files
//            written through the page cache (writeback started every 32 MB) and fsync'd, then the
//            manifest and the rename; the whole save() is the stall. (Only the async save's staged
//            images are aligned for direct I/O: common/files.h, try_write_plan.)
//   thread   the async save unpaced (checkpoint.write_pace 0): staged copy + writer thread, its
//            images written with direct I/O as fast as the disk takes them
//   paced    the same, its writes spread over --pace of the interval (checkpoint.write_pace;
//            the interval: --interval steps times the mean step time, as the trainer's due())
//   nowrite  the async save unpaced with its staged images' disk writes discarded (see
//            DiscardDirectWrites): what the save costs training apart from the disk
// With OPENBLAS_NUM_THREADS=1 training leaves the writer a CPU of its own, as a GPU host does.
// prints one JSON line per save and a summary line (medians over rounds 1.., round 0 left out:
// it is each Checkpointer's first save, and a paced save's first has no measured write time yet;
// with --rounds 1, round 0 alone), with the machine (CPU model, CPUs, the hypervisor's steal over
// the whole run):
//   <mode>_stall_ms        measured stall (sync: the whole save)
//   <mode>_reported_ms     what the Checkpointer reported as block_ms (ckpt_block_ms in metrics)
//   <mode>_peak_extra_mb   peak RSS of this process during the save over the RSS
//                          before it (the staging buffer is allocated at start, or with
//                          --no-prepare in the first save, and kept)
//   <mode>_pct_of_sync     stall as a percentage of the synchronous save's (both medians)
//   <mode>_inflight_s      seconds from save() to the end of the save (paced: about --pace of
//                          the interval)
//   <mode>_pace_ms, <mode>_slept_ms  the time the writes were to be spread over (0: unpaced) and
//                          the time the writer slept to keep that pace
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

// Every Checkpointer of the run: each step's time goes to each one's due(), whose running mean of
// the step time (times the interval) is what a paced save spreads its writes over.
std::vector<lm::Checkpointer*> g_all;
int64_t g_steps = 0;

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
  ++g_steps;
  for (lm::Checkpointer* c : g_all) c->due(g_steps, s);
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
  double call_ms = 0, peak_mb = 0, steal_ms = 0, window_s = 0, inflight_s = 0;  // peak: RSS; steal: whole window
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
    if (!reps.empty() && run.inflight_s == 0) run.inflight_s = ms_since(t0) / 1e3;
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
    if (m != "sync" && m != "thread" && m != "paced" && m != "nowrite")
      throw lm::UsageError("--modes: unknown mode '" + m + "' (sync, thread, paced, nowrite)");
    modes.push_back(m);
  }
  return modes;
}

// The median of a mode's rounds 1.. (round 0, each Checkpointer's first save, left out), or round
// 0's value alone when there is no other.
double median_after_first(const std::vector<double>& v) {
  std::vector<double> rest;  // element by element: GCC 14 (-Warray-bounds) misreads an iterator-range copy here
  rest.reserve(v.size());
  for (size_t i = v.size() > 1 ? 1 : 0; i < v.size(); ++i) rest.push_back(v[i]);
  return median(std::move(rest));
}

// The machine the stall was measured on: CPU model (/proc/cpuinfo) and CPUs.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      std::string v = line.substr(line.find(':') + 1);
      return v.substr(std::min(v.size(), v.find_first_not_of(' ')));
    }
  return "unknown";
}

// The summary line: per mode, medians over rounds 1.., and each stall as a percentage of the sync
// save's; the machine.
void print_summary(const std::vector<std::string>& modes, std::map<std::string, PerMode>& per, double state_mb,
                   int rounds, double step_ms, double base_mb, double run_steal_pct, int interval, double pace) {
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  nlohmann::json out = {{"state_mb", state_mb}, {"rounds", rounds}, {"step_ms", step_ms},
                        {"blas_threads", blas ? blas : "default"}, {"intra_op_threads", torch::get_num_threads()},
                        {"rss_mb_before_save", base_mb}, {"interval_steps", interval}, {"pace", pace},
                        {"medians_over", rounds > 1 ? "rounds 1.. (round 0 left out)" : "round 0 alone"},
                        {"cpu_model", cpu_model()}, {"cpus", std::thread::hardware_concurrency()},
                        {"run_steal_pct", run_steal_pct},
                        {"sync_is", "the trainer's synchronous save (checkpoint.async false): files written through "
                                    "the page cache and fsync'd; the async modes write staged images with direct I/O"}};
  const double sync = per["stall"].count("sync") ? median_after_first(per["stall"]["sync"]) : 0;
  for (auto& mode : modes) {
    for (const char* k : {"stall", "reported", "peak_extra", "steal", "inflight", "pace", "slept"}) {
      const std::string key = std::string(k) == "peak_extra" ? "_peak_extra_mb"
                              : std::string(k) == "inflight" ? "_inflight_s"
                                                              : "_" + std::string(k) + "_ms";
      out[mode + key] = median_after_first(per[k][mode]);
    }
    out[mode + "_first_stall_ms"] = per["stall"][mode].front();  // round 0: the first save of a Checkpointer
    if (sync > 0) out[mode + "_pct_of_sync"] = 100.0 * median_after_first(per["stall"][mode]) / sync;
  }
  std::cout << out.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  return lm::run_main("ckpt_stall", [&] {
    CLI::App app{"real stall of checkpoint saves in a training loop"};
    std::string dir, modes_arg = "sync,thread,paced,nowrite";
    int rounds = 4, clean = 2, layers = 12, seq = 64, interval = 40;
    double pace = 0.5;
    bool ema = false, no_prepare = false;
    app.add_option("--dir", dir, "scratch directory on the disk to measure")->required();
    app.add_option("--rounds", rounds, "rounds (each saves once per mode)");
    app.add_option("--clean", clean, "steps without a save before each save");
    app.add_option("--modes", modes_arg, "comma-separated: sync, thread, paced, nowrite");
    app.add_option("--interval", interval, "checkpoint interval in steps (what mode paced spreads its writes over)");
    app.add_option("--pace", pace, "mode paced: checkpoint.write_pace, the share of the interval");
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
      cc.async = mode != "sync", cc.keep_last = 1, cc.every_steps = interval;
      cc.write_pace = mode == "paced" ? pace : 0;
      lm::files::remove_all(dir + "/" + mode);
      cks[mode] = std::make_unique<lm::Checkpointer>(cc, dir + "/" + mode, 0, 1);
      g_all.push_back(cks[mode].get());
    }
    PeakSampler sampler;
    std::map<std::string, PerMode> per;  // "stall", "reported", ... -> mode -> per round
    PerMode &stall = per["stall"], &reported = per["reported"], &peak = per["peak_extra"], &steal = per["steal"];
    lm::clock::StealMeter run_steal;
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
        per["inflight"][mode].push_back(run.inflight_s);
        per["pace"][mode].push_back(run.report.pace_ms), per["slept"][mode].push_back(run.report.slept_ms);
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
                                    {"peak_extra_mb", peak[mode].back()}, {"steal_ms", steal[mode].back()},
                                    {"inflight_s", per["inflight"][mode].back()}, {"pace_ms", per["pace"][mode].back()},
                                    {"slept_ms", per["slept"][mode].back()}}.dump() << std::endl;
      }
    }
    print_summary(modes, per, state_mb, rounds, 1e3 * median(all_clean), base_mb, run_steal.take_pct(), interval, pace);
    for (auto& mode : modes) lm::files::remove_all(dir + "/" + mode);
    lm::files::set_file_system(nullptr);
    return 0;
  });
}
