// Bucketed gradient reduction launched from autograd hooks, so communication overlaps backward.
// The strategies' shared machinery (parallel.h): each says what a full bucket's reduction is.
#pragma once

#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/torch/compat.h"
#include "trainer/optim/flat_params.h"
#include "trainer/comm/process_group.h"

namespace lm {

// The gradient buckets of a flat buffer: contiguous ranges of whole parameters of at most
// bucket_mb (one parameter per bucket when it is bigger), in flat order. The one cut every
// strategy's buckets and pieces share.
std::vector<FlatRange> plan_buckets(const FlatParams& flat, double bucket_mb);

// Reduces gradients over ranks in buckets, each launched as soon as backward has accumulated every
// gradient in it (post-hooks on the parameters' AccumulateGrad nodes), so communication overlaps
// the rest of backward. Buckets are contiguous ranges of the flat gradient buffer and are launched
// strictly in bucket order (the same on every rank).
class GradSync {
 public:
  // What a full bucket's reduction is: bucket i's gradients in (its range of the flat gradient
  // buffer; undefined where the gradients are per parameter, GradPath::pieces), the collectives
  // launched out, waited for by finish() (default: one all-reduce of the sums). `what` names them in
  // errors ("all-reduce").
  using Reduce = std::function<std::vector<std::shared_ptr<Comm::Pending>>(size_t bucket, torch::Tensor grads)>;
  GradSync(Comm& comm, FlatParams& flat, torch::nn::Module& model, std::vector<FlatRange> buckets, Reduce reduce = nullptr,
           std::string what = "all-reduce");
  ~GradSync();
  // Before each micro-step's backward: sync = this is the last micro-step of the step (only it
  // communicates).
  void begin(bool sync);
  // After the last micro-step's backward: launches buckets no hook launched (parameters without
  // gradients) and waits for all of them. The first time, logs how many buckets the hooks launched
  // during the backward ("data parallel: 5 of 5 gradient buckets launched from the backward's hooks
  // at step 1").
  void finish(int64_t step);
  size_t num_buckets() const { return buckets_.size(); }

 private:
  struct Bucket {
    int64_t offset, numel;
    int pending_total, pending;
    std::vector<std::shared_ptr<Comm::Pending>> work;
  };
  void ready(size_t entry);
  void launch_ready_in_order();

  Comm& comm_;
  FlatParams& flat_;
  Reduce reduce_;
  std::string what_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_entry_;
  size_t next_launch_ = 0;
  bool active_ = false;
  bool reported_ = false;
  std::vector<std::pair<compat::AutogradNodePtr, uintptr_t>> hooks_;  // AccumulateGrad nodes, hook keys
};

}  // namespace lm
