// Bucketed gradient all-reduce launched from autograd hooks, so communication overlaps backward.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <utility>
#include <vector>

#include "common/torch/compat.h"
#include "trainer/ddp/process_group.h"

namespace lm {

class FlatParams;
class ZeroShards;

// Sums gradients over ranks in buckets of ~bucket_mb, each launched as soon as backward has
// accumulated every gradient in it (post-hooks on the parameters' AccumulateGrad nodes), so
// communication overlaps the rest of backward. Buckets are contiguous ranges of the flat gradient
// buffer and are launched strictly in bucket order (the same on every rank).
class GradSync {
 public:
  // zero (optional, ZeRO-1): with its reduce_scatter(), each bucket is reduce-scattered into the
  // owned pieces instead of all-reduced (zero.h).
  GradSync(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb, const ZeroShards* zero = nullptr);
  ~GradSync();
  // Before each micro-step's backward: sync = this is the last micro-step of the step (only it
  // communicates).
  void begin(bool sync);
  // After the last micro-step's backward: launches buckets no hook launched (parameters without
  // gradients) and waits for all of them. Afterwards flat.grads() holds the sum over ranks. The
  // first time, logs how many buckets the hooks launched during the backward ("data parallel: 5 of
  // 5 gradient buckets launched from the backward's hooks at step 1").
  void finish(int64_t step);
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t offset, numel;
    int pending_total, pending;
    std::shared_ptr<Comm::Pending> work, tail;  // tail: ZeRO-1's left-over values, all-reduced
  };
  void ready(size_t entry);
  void launch_ready_in_order();

  Comm& comm_;
  FlatParams& flat_;
  const ZeroShards* zero_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_entry_;
  size_t next_launch_ = 0;
  bool active_ = false;
  bool reported_ = false;
  std::vector<std::pair<compat::AutogradNodePtr, uintptr_t>> hooks_;  // AccumulateGrad nodes, hook keys
};

// Data parallel over `comm`: rank 0's parameters broadcast to every rank (after a resume every rank
// restored the same ones: one source of truth all the same), then the gradient buckets (logged).
std::unique_ptr<GradSync> start_data_parallel(Comm& comm, FlatParams& flat, torch::nn::Module& model, double bucket_mb,
                                              const ZeroShards* zero = nullptr);

}  // namespace lm
