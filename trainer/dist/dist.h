// Data parallelism: the launch contract, one c10d process group per run, and bucketed gradient
// all-reduce launched from autograd hooks.
//
// Launch contract (LaunchEnv::from_environment, the only reader of these variables):
//   torchrun / build/bin/launch: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//     MASTER_PORT, TORCHELASTIC_RESTART_COUNT; with TORCHELASTIC_USE_AGENT_STORE=True the launcher
//     hosts the TCPStore and every rank (rank 0 included) connects as a client under the prefix
//     /worker/attempt_<restart count>, as real torchrun's static rendezvous does; otherwise rank 0
//     hosts it.
//   Slurm (srun), when RANK is unset: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//     SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE; MASTER_ADDR (else the first host of
//     SLURM_JOB_NODELIST) and MASTER_PORT (else 29500).
//   Neither: a single process, no process group.
// Every collective waits at most dist.timeout_s; a dead or hung peer makes the survivors throw an
// Error naming the collective instead of hanging.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "trainer/dist/dist_config.h"

namespace lm {

class FlatParams;

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  bool agent_store = false;
  std::string source = "single";  // torchrun | slurm | single
  // Reads the variables above. Throws UsageError naming a malformed variable.
  static LaunchEnv from_environment();
};

// One process group over all ranks (Gloo on CPU, NCCL on CUDA). Not thread-safe: the training
// thread issues every collective, in the same order on every rank.
class Comm {
 public:
  Comm(const LaunchEnv& env, const DistConfig& cfg, const torch::Device& device);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const std::string& backend() const { return backend_; }

  // Blocking collectives; `what` names them in errors. Tensors may live on any device.
  void broadcast(torch::Tensor& t, int root, const std::string& what);
  void all_reduce_sum(torch::Tensor& t, const std::string& what);
  // (world_size * t.numel(),) holding every rank's t in rank order.
  torch::Tensor all_gather(const torch::Tensor& t, const std::string& what);
  void barrier(const std::string& what);

  // Asynchronous sum all-reduce of a contiguous tensor on the comm device; wait() returns when done.
  struct Pending;
  std::shared_ptr<Pending> all_reduce_async(torch::Tensor t);
  void wait(const std::shared_ptr<Pending>& p, const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1;
  std::string backend_;
  double timeout_s_ = 300;
};

// Sums gradients over ranks in buckets of ~bucket_mb, each launched as soon as backward has
// accumulated every gradient in it (post-hooks on the parameters' AccumulateGrad nodes), so
// communication overlaps the rest of backward. Buckets are contiguous ranges of the flat gradient
// buffer and are launched strictly in bucket order (the same on every rank).
class GradSync {
 public:
  GradSync(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb);
  ~GradSync();
  // Before each micro-step's backward: sync = this is the last micro-step of the step (only it
  // communicates).
  void begin(bool sync);
  // After the last micro-step's backward: launches buckets no hook launched (parameters without
  // gradients) and waits for all of them. Afterwards flat.grads() holds the sum over ranks.
  void finish(int64_t step);
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t offset, numel;
    int pending_total, pending;
    std::shared_ptr<Comm::Pending> work;
  };
  void ready(size_t entry);
  void launch_ready_in_order();

  Comm& comm_;
  FlatParams& flat_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_entry_;
  size_t next_launch_ = 0;
  bool active_ = false;
  std::vector<std::pair<std::shared_ptr<void>, uintptr_t>> hooks_;
};

}  // namespace lm
