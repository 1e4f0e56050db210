// What the checkpoint tests share (checkpoint_test.cpp, checkpoint_writer_test.cpp).
#pragma once

#include <torch/torch.h>

#include <sys/types.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "trainer/checkpoint/state.h"

namespace lm::test {

// A small state of every scope (replicated tensors and values, a per-rank value).
inline CheckpointState make_state(int64_t step, float fill) {
  CheckpointState st;
  st.step = step;
  st.run = {{"data_version", "v"}};
  st.replicated["progress"].values = {{"step", step}};
  st.replicated["model"].tensors = {{"w", torch::full({64, 64}, fill)}, {"b", torch::arange(8, torch::kFloat)}};
  st.replicated["optimizer"].tensors = {{"exp_avg/w", torch::full({64, 64}, fill / 2)}};
  st.per_rank["loader"].values = {{"cursor", step * 10}};
  return st;
}

inline std::vector<std::string> names(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The thread of this process named `comm` (pthread_setname_np), or 0 when there is none.
inline pid_t thread_named(const std::string& comm) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it("/proc/self/task", ec), end; !ec && it != end; it.increment(ec)) {
    std::ifstream in(it->path() / "comm");
    std::string name;
    if (std::getline(in, name) && name == comm) return static_cast<pid_t>(std::stol(it->path().filename().string()));
  }
  return 0;
}

}  // namespace lm::test
