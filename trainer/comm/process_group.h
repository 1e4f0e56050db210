// One c10d process group per run (Gloo on CPU, NCCL on CUDA) and its blocking and async
// collectives. Every collective waits at most dist.timeout_s; a dead or hung peer makes the
// survivors throw an Error naming the collective instead of hanging.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "run/config/dist_config.h"
#include "trainer/comm/launch_env.h"

namespace lm {

// One process group over all ranks (Gloo on CPU, NCCL on CUDA). Not thread-safe: the training
// thread issues every collective, in the same order on every rank.
class Comm {
 public:
  // nccl_log_dir: with NCCL, where NCCL's own log goes per rank (NCCL_DEBUG=INFO and
  // NCCL_DEBUG_FILE unless set: "why did it break"); "" leaves NCCL's environment alone.
  Comm(const LaunchEnv& env, const DistConfig& cfg, const torch::Device& device, const std::string& nccl_log_dir = "");
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
  // Point to point: this rank sends `mine` to `partner` and receives the partner's tensor of the
  // same shape, returned (the lower rank sends first, the higher receives first, so NCCL's blocking
  // pairs match). Both ranks call it with each other as partner and the same tag.
  torch::Tensor exchange(const torch::Tensor& mine, int partner, int tag, const std::string& what);

  // Asynchronous sum all-reduce of a contiguous tensor on the comm device; wait() returns when done.
  struct Pending;
  std::shared_ptr<Pending> all_reduce_async(torch::Tensor t);
  // Asynchronous sum reduce-scatter: `out` (s values) gets this rank's slice [rank*s, (rank+1)*s)
  // of the sum of every rank's `in` (world*s values); `out` may be that slice of `in` (in place).
  // NCCL reduce-scatters; Gloo has no reduce-scatter and all-reduces a copy of `in` instead (the
  // slice is copied into `out` by wait()).
  std::shared_ptr<Pending> reduce_scatter_async(torch::Tensor in, torch::Tensor out);
  // Asynchronous broadcast of a contiguous tensor on the comm device from `root`, in place.
  std::shared_ptr<Pending> broadcast_async(torch::Tensor t, int root);
  // Asynchronous in-place all-gather (NCCL only): `t` holds world*s values; rank r's slice
  // [r*s, (r+1)*s) goes to every rank, in place (ncclAllGather with the send buffer inside the
  // receive buffer).
  std::shared_ptr<Pending> all_gather_in_place_async(torch::Tensor t);
  void wait(const std::shared_ptr<Pending>& p, const std::string& what);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1;
  std::string backend_;
  double timeout_s_ = 300;
};

// The run's process group, or nullptr: one rank has one only when dist.backend names one (the
// device check runs NCCL so; it meets on any free loopback port). Logs the rendezvous.
std::unique_ptr<Comm> open_process_group(const LaunchEnv& launch, const DistConfig& cfg, const torch::Device& device,
                                         const std::string& nccl_log_dir);

}  // namespace lm
