// ckpt_bench: save and load cost of a full checkpoint of GPT-2 124M with its AdamW state
// (~1.5 GB) on CPU, next to LibTorch's own torch::save of the same tensors.
//
//   ckpt_bench --dir DIR [--reps N]     prints one JSON line:
//     sync_ms / sync_mb_per_s      Checkpointer save, synchronous (write + fsync + commit)
//     async_call_ms / async_ms     Checkpointer save with checkpoint.async: the save() call alone
//                                  (NOT the stall: the staging copy and the writer run while
//                                  training goes on; bench/ckpt_stall.sh measures the real stall
//                                  in a training loop), and until the files are committed
//     load_ms / load_mb_per_s      Checkpointer::load_resume (one pass: read + checksum)
//     torch_save_ms / torch_save_mb_per_s   torch::save of the same tensors, then fsync
// The dd baseline of the same byte count runs in bench/checkpoint.sh (same disk, same run).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>

#include "models/gpt.h"
#include "trainer/checkpoint/checkpoint.h"
#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "trainer/runtime/host_allocator.h"
#include "trainer/checkpoint/state.h"
#include "trainer/optim/adamw.h"

namespace {
using Clock = std::chrono::steady_clock;
using lm::clock::ms_since;

struct Timings {
  double sync_ms = 1e18, block_ms = 1e18, async_ms = 1e18, load_ms = 1e18, torch_ms = 1e18;
};

// One sync and one async save of `st` into DIR/sync and DIR/async; keeps the best times.
void time_saves(const lm::CheckpointState& st, const std::string& dir, Timings& t) {
  for (bool async : {false, true}) {
    const std::string run = dir + (async ? "/async" : "/sync");
    lm::files::remove_all(run);
    lm::CheckpointConfig cc;
    cc.async = async;
    lm::Checkpointer ck(cc, run, 0, 1);
    auto t0 = Clock::now();
    ck.save(st);
    const double returned = ms_since(t0);
    ck.wait();
    const double total = ms_since(t0);
    for (auto& rep : ck.finished())
      if (!rep.error.empty()) throw lm::Error(rep.error);
    if (async) t.block_ms = std::min(t.block_ms, returned), t.async_ms = std::min(t.async_ms, total);
    else t.sync_ms = std::min(t.sync_ms, total);
  }
}

// Loading DIR/sync back (read + verify every file once), then torch::save of the same tensors.
void time_load_and_torch_save(const lm::CheckpointState& st, const std::vector<torch::Tensor>& all,
                              const std::string& dir, Timings& t) {
  {
    lm::CheckpointConfig cc;
    lm::Checkpointer ck(cc, dir + "/sync", 0, 1);
    ::sync();
    auto t0 = Clock::now();
    lm::CheckpointState loaded;
    ck.load_resume(&loaded);
    t.load_ms = std::min(t.load_ms, ms_since(t0));
    if (loaded.replicated.at(lm::state_key::kModel).tensors.size() != st.replicated.at(lm::state_key::kModel).tensors.size())
      throw lm::Error("load returned the wrong tensors");
  }
  const std::string path = dir + "/torch_save.pt";
  auto t0 = Clock::now();
  torch::save(all, path);
  int fd = ::open(path.c_str(), O_RDONLY);
  ::fsync(fd);
  ::close(fd);
  t.torch_ms = std::min(t.torch_ms, ms_since(t0));
  std::filesystem::remove(path);
}

}  // namespace

int main(int argc, char** argv) {
  return lm::run_main("ckpt_bench", [&] {
    CLI::App app{"checkpoint save/load benchmark"};
    std::string dir;
    int reps = 2;
    app.add_option("--dir", dir, "scratch directory on the disk to measure")->required();
    app.add_option("--reps", reps, "repetitions (best is reported)");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);
      throw lm::UsageError(e.what());
    }
    lm::install_caching_host_allocator();  // as the trainer does
    lm::ModelConfig mc;
    mc.n_layer = 12, mc.n_head = 12, mc.d_model = 768, mc.seq_len = 1024;
    torch::manual_seed(0);
    lm::GPT model(mc, lm::padded_vocab(mc, 50257));
    lm::FlatParams flat(*model);
    lm::OptimConfig oc;
    lm::AdamW opt(flat, oc);
    opt.exp_avg().normal_();
    opt.exp_avg_sq().uniform_();
    // The trainer's components under their own keys (as trainer/train.cpp registers them).
    lm::StateRegistry registry;
    using Scope = lm::StateRegistry::Scope;
    lm::ModuleState model_state(*model, "model");
    registry.add(lm::state_key::kModel, Scope::kReplicated, model_state);
    registry.add(lm::state_key::kOptimizer, Scope::kReplicated, opt);
    const lm::CheckpointState st = registry.snapshot(1, nlohmann::json::object());
    std::vector<torch::Tensor> all;  // every tensor saved
    for (auto& [key, c] : st.replicated)
      for (auto& [n, t] : c.tensors) all.push_back(t);
    double mb = 0;
    for (auto& t : all) mb += t.numel() * t.element_size() / 1e6;
    Timings t;
    for (int r = 0; r < reps; ++r) {
      time_saves(st, dir, t);
      time_load_and_torch_save(st, all, dir, t);
    }
    lm::files::remove_all(dir + "/sync");
    lm::files::remove_all(dir + "/async");
    std::cout << nlohmann::json{{"params", model->num_params()}, {"state_mb", mb}, {"sync_ms", t.sync_ms},
                                {"sync_mb_per_s", mb / t.sync_ms * 1e3}, {"async_call_ms", t.block_ms},
                                {"async_ms", t.async_ms}, {"load_ms", t.load_ms}, {"load_mb_per_s", mb / t.load_ms * 1e3},
                                {"torch_save_ms", t.torch_ms}, {"torch_save_mb_per_s", mb / t.torch_ms * 1e3}}
                     .dump()
              << std::endl;
    return 0;
  });
}
