// Groups of real trainer processes over Gloo on loopback, and what the parallelism tests compare
// between two runs (ZeroE2E, Zero3E2E, InvariantE2E): per-step losses and norms, the checkpoint's
// weights, EMA and optimizer state.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/testutil.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/optim/flat_state.h"

namespace lm::test {

// `config` + data + run dir + `common` + a run's own extra arguments, for `world` trainer processes
// (world 1: no launcher variables; every rank OMP_NUM_THREADS=1).
struct GroupRun {
  std::string config = "configs/tiny.yaml";
  std::vector<std::string> common;
  int timeout_s = 240;

  std::vector<std::string> args(const std::string& dir, const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {source_path(config), "data.train=" + shared_bytes_dataset(), "run.dir=" + dir};
    a.insert(a.end(), common.begin(), common.end());
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // Every rank's exit code; `env_all` goes to every rank, `env_rank1` to rank 1 only.
  std::vector<int> run(const std::string& dir, int world, const std::vector<std::string>& extra,
                       const std::vector<std::string>& env_all = {}, const std::string& env_rank1 = "") const {
    const int port = free_port();
    std::filesystem::create_directories(dir);
    std::vector<Proc> ranks;
    outs_.clear();
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> env = rank_env(r, world, port);
      env.insert(env.end(), env_all.begin(), env_all.end());
      if (r == 1 && !env_rank1.empty()) env.push_back(env_rank1);
      outs_.push_back(dir + "/out" + std::to_string(r) + "_" + std::to_string(counter_++));
      ranks.push_back(spawn_bin("trainer", args(dir, extra), outs_.back(), env));
    }
    std::vector<int> codes;
    for (auto& r : ranks) codes.push_back(wait_proc(r, timeout_s));
    return codes;
  }
  // Every rank must exit 0 (the failing rank's output printed).
  void run_ok(const std::string& dir, int world, const std::vector<std::string>& extra,
              const std::vector<std::string>& env_all = {}) const {
    const auto codes = run(dir, world, extra, env_all);
    for (size_t r = 0; r < codes.size(); ++r)
      ASSERT_EQ(codes[r], 0) << "rank " << r << "\n" << read_text(outs_[r]);
  }
  mutable int counter_ = 0;
  mutable std::vector<std::string> outs_;  // the last run's output file per rank
};

// Every train record's (loss, grad_norm).
inline std::vector<std::pair<double, double>> loss_and_norm(const std::string& dir) {
  std::vector<std::pair<double, double>> out;
  for (auto& l : metrics_of_kind(dir + "/metrics.jsonl", "train")) {
    const auto j = nlohmann::json::parse(l);
    out.emplace_back(j["loss"].get<double>(), j["grad_norm"].get<double>());
  }
  return out;
}

// Every train record's loss and grad_norm as JSON text ("null" for a skipped step's loss).
inline std::vector<std::string> losses_as_text(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& l : metrics_of_kind(dir + "/metrics.jsonl", "train")) {
    const auto j = nlohmann::json::parse(l);
    out.push_back(j["loss"].dump() + " " + j["grad_norm"].dump());
  }
  return out;
}

inline std::string checkpoint_dir(const std::string& run, int64_t step) {
  char name[40];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08lld", static_cast<long long>(step));
  return run + name;
}

// A component of a checkpoint ("model", "ema") as one flat tensor per parameter, from its whole file
// ("<key>.safetensors") or from its parts ("<key>.part_<r>.safetensors", tensors "<param>[a:b]"
// holding values a..b-1; ZeRO-3 saves each rank's pieces): every value must come exactly once.
inline std::map<std::string, torch::Tensor> checkpoint_component(const std::string& dir, const std::string& key) {
  std::map<std::string, torch::Tensor> out;
  if (std::filesystem::exists(dir + "/" + key + ".safetensors")) {
    for (auto& [name, t] : load_safetensors(dir + "/" + key + ".safetensors")) out[name] = t.reshape({-1});
    return out;
  }
  std::map<std::string, std::vector<std::pair<int64_t, torch::Tensor>>> slices;
  for (int r = 0; std::filesystem::exists(dir + "/" + key + ".part_" + std::to_string(r) + ".safetensors"); ++r)
    for (auto& [name, t] : load_safetensors(dir + "/" + key + ".part_" + std::to_string(r) + ".safetensors")) {
      std::string param;
      int64_t a = 0, b = -1;
      const bool sliced = split_slice_name(name, &param, &a, &b) && b >= 0;
      EXPECT_TRUE(sliced) << name;
      if (!sliced) continue;
      slices[param].emplace_back(a, t.reshape({-1}));
    }
  for (auto& [name, parts] : slices) {
    std::sort(parts.begin(), parts.end(), [](auto& a, auto& b) { return a.first < b.first; });
    std::vector<torch::Tensor> ts;
    int64_t at = 0;
    for (auto& [begin, t] : parts) {
      EXPECT_EQ(begin, at) << name << ": a gap or an overlap";
      at += t.numel();
      ts.push_back(t);
    }
    out[name] = torch::cat(ts);
  }
  return out;
}

// The EMA of the checkpoint at `step` of two runs, bit for bit (each run may have saved it in its
// own layout, whole or in parts: compared parameter by parameter).
inline void expect_same_ema(const std::string& a, const std::string& b, int64_t step) {
  const auto ea = checkpoint_component(checkpoint_dir(a, step), "ema"), eb = checkpoint_component(checkpoint_dir(b, step), "ema");
  ASSERT_FALSE(ea.empty());
  ASSERT_EQ(ea.size(), eb.size());
  for (const auto& [name, t] : ea) {
    ASSERT_TRUE(eb.count(name)) << name;
    EXPECT_TRUE(torch::equal(t, eb.at(name))) << name;
  }
}

// The weights, the EMA and the optimizer state files of the checkpoint at `step`, byte for byte.
inline void expect_same_state(const std::string& a, const std::string& b, int64_t step, const std::string& what) {
  for (const char* f : {"model.safetensors", "ema.safetensors", "optimizer.safetensors"}) {
    const std::string fa = checkpoint_dir(a, step) + "/" + f, fb = checkpoint_dir(b, step) + "/" + f;
    ASSERT_TRUE(std::filesystem::exists(fa)) << fa;
    EXPECT_TRUE(read_text(fa) == read_text(fb)) << f << ", " << what;  // not printed: binary
  }
}

// The pid of the worker with RANK=rank started under TORCHELASTIC_RUN_ID=run_id, or -1.
inline int find_worker(const std::string& run_id, int rank) {
  for (auto& e : std::filesystem::directory_iterator("/proc")) {
    const std::string pid = e.path().filename().string();
    if (pid.find_first_not_of("0123456789") != std::string::npos) continue;
    // Not test::read_text: a process may exit meanwhile, or hide its environment; both are "not it".
    std::ifstream in("/proc/" + pid + "/environ", std::ios::binary);
    std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::replace(env.begin(), env.end(), '\0', '\n');
    env = "\n" + env;
    if (env.find("\nTORCHELASTIC_RUN_ID=" + run_id + "\n") != std::string::npos &&
        env.find("\nRANK=" + std::to_string(rank) + "\n") != std::string::npos)
      return std::stoi(pid);
  }
  return -1;
}

}  // namespace lm::test
