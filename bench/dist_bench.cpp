// dist_bench: all-reduce bandwidth of the trainer's process group (trainer/comm/process_group.h) for bucket
// sizes from 1 to 100 MB. Start it like the trainer, one process per rank (build/bin/launch,
// torchrun, srun). Rank 0 prints one JSON line: per size, the best time over --reps and the
// algorithm and bus bandwidths (bus = algorithm x 2(W-1)/W, as nccl-tests reports it).
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <iostream>

#include "trainer/comm/process_group.h"
#include "common/errors.h"

int main(int argc, char** argv) {
  return lm::run_main("dist_bench", [&] {
    CLI::App app{"all-reduce bandwidth"};
    std::vector<double> sizes_mb = {1, 2, 5, 10, 25, 50, 100};
    int reps = 5;
    app.add_option("--sizes-mb", sizes_mb, "buffer sizes in MB");
    app.add_option("--reps", reps, "timed repetitions per size");
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      if (e.get_exit_code() == 0) return app.exit(e);
      throw lm::UsageError(e.what());
    }
    auto env = lm::LaunchEnv::from_environment();
    if (env.world_size < 2) throw lm::UsageError("run it with at least 2 ranks (e.g. build/bin/launch --nproc-per-node 2 -- ...)");
    lm::DistConfig dc;
    lm::Comm comm(env, dc, torch::Device(torch::kCPU));
    nlohmann::json out = nlohmann::json::array();
    for (double mb : sizes_mb) {
      auto t = torch::ones({static_cast<int64_t>(mb * 1e6 / 4)}, torch::kFloat);
      comm.all_reduce_sum(t, "warm-up");
      double best = 1e18;
      for (int r = 0; r < reps; ++r) {
        comm.barrier("barrier");
        auto t0 = std::chrono::steady_clock::now();
        comm.all_reduce_sum(t, "all-reduce");
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      const double algbw = mb / 1e3 / best, w = env.world_size;
      out.push_back({{"mb", mb}, {"ms", best * 1e3}, {"algbw_gb_s", algbw}, {"busbw_gb_s", algbw * 2 * (w - 1) / w}});
    }
    if (env.rank == 0) std::cout << nlohmann::json{{"world_size", env.world_size}, {"backend", "gloo"}, {"allreduce", out}}.dump() << std::endl;
    return 0;
  });
}
