// The gradients of each bucket reduced and kept as this rank's pieces: ZeRO-2 and 3 (see piece_reduction.h).
#include "trainer/parallel/piece_reduction.h"

#include "trainer/parallel/bucket_reduction.h"

#include "common/log.h"

namespace lm {

PieceReduction::PieceReduction(const ParallelInit& init, const OptimizerShards& shards)
    : comm_(*init.comm), flat_(init.flat), model_(init.model), bucket_mb_(init.dist.bucket_mb), shards_(shards),
      layout_(shards.layout()) {
  TORCH_CHECK(flat_.path().pieces, "PieceReduction: the flat parameters need GradPath::pieces (parallel.h grads_in_pieces)");
  flat_.keep_grad_pieces(shards.owned());
  // Where each bucket's piece sits in the packed buffer (empty pieces left out).
  int64_t at = 0;
  const auto& entries = flat_.entries();
  size_t e = 0;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    mine_.emplace_back();
    for (const auto& r : layout_.ranges(b, layout_.rank)) mine_.back().push_back({r, at}), at += r.numel;
    const auto& bucket = layout_.buckets[b];
    const size_t first = e;
    while (e < entries.size() && entries[e].offset < bucket.offset + bucket.numel) ++e;
    entries_of_.emplace_back(first, e);
  }
  stream_norm_ = !shards_.reduce_scatter() && flat_.options().device().is_cpu();
  if (init.dist.invariant) {
    batch_ = std::make_unique<GlobalBatch>(init);
    stash_.resize(layout_.buckets.size());
    combine_ = pick_combine(layout_.world);
    stream_norm_ = flat_.options().device().is_cpu();  // every rank sees every bucket's sums (the all-gather)
  }
}

torch::Tensor PieceReduction::bucket_sums(size_t i) {
  torch::NoGradGuard ng;
  const auto& bucket = layout_.buckets[i];
  // 0 + each gradient: what plain data parallelism's zeroed flat buffer holds after the backward.
  auto sums = torch::zeros({bucket.numel}, flat_.options());
  auto& tensors = flat_.tensors();
  const auto& entries = flat_.entries();
  for (size_t e = entries_of_[i].first; e < entries_of_[i].second; ++e) {
    auto& t = tensors[e];
    if (!t.grad().defined()) continue;  // no gradient this step: zeros, as in the flat buffer
    sums.narrow(0, entries[e].offset - bucket.offset, entries[e].numel).add_(t.grad().reshape({-1}));
    t.mutable_grad().reset();  // freed: the bucket's buffer holds it now
  }
  return sums;
}

void PieceReduction::combine(size_t i) {
  torch::NoGradGuard ng;
  const auto& bucket = layout_.buckets[i];
  torch::Tensor mine = stash_[i].finish();
  stash_[i] = TreeSum();  // its spare buffers dropped with it
  const torch::Tensor sums =
      sum_over_ranks(comm_, std::move(mine), combine_, layout_.rank, layout_.world,
                     strf("%s of gradient bucket %zu/%zu (dist.invariant)", combine_name(combine_), i + 1, layout_.buckets.size()));
  keep_mine(i, sums);
  if (stream_norm_) norm_.add(bucket.offset, sums.data_ptr<float>(), sums.numel());
}

GradSync::Reduce PieceReduction::reduce() {
  return [this](size_t i, torch::Tensor) {
    if (batch_) {  // dist.invariant: into the bucket's tree; the last micro-batch combines the ranks' sums
      stash_[i].push(bucket_sums(i), /*borrowed=*/false);
      if (last_) combine(i);
      return std::vector<std::shared_ptr<Comm::Pending>>{};
    }
    while (in_flight_.size() >= kInFlight) complete_oldest();
    torch::NoGradGuard ng;
    const auto& bucket = layout_.buckets[i];
    auto sums = bucket_sums(i);
    InFlight f{i, sums, {}};
    const int64_t s = layout_.piece_size(i), main = s * layout_.world;
    if (!shards_.reduce_scatter()) {
      f.work.push_back(comm_.all_reduce_async(sums));
    } else {
      auto mine = flat_.grad_pieces().narrow(0, piece_at(i), s);
      if (s > 0) f.work.push_back(comm_.reduce_scatter_async(sums.narrow(0, 0, main), mine));
      if (main < bucket.numel) f.work.push_back(comm_.all_reduce_async(sums.narrow(0, main, bucket.numel - main)));
    }
    in_flight_.push_back(std::move(f));
    return std::vector<std::shared_ptr<Comm::Pending>>{};  // waited for here (complete_oldest), not by GradSync
  };
}

void PieceReduction::keep_mine(size_t i, const torch::Tensor& sums) {
  const auto& bucket = layout_.buckets[i];
  for (const auto& [r, at] : mine_[i])
    flat_.grad_pieces().narrow(0, at, r.numel).copy_(sums.narrow(0, r.offset - bucket.offset, r.numel));
}

void PieceReduction::complete_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  for (auto& w : f.work)
    comm_.wait(w, strf("%s of gradient bucket %zu/%zu", reduce_name().c_str(), f.bucket + 1, layout_.buckets.size()));
  torch::NoGradGuard ng;
  const auto& bucket = layout_.buckets[f.bucket];
  auto dst = flat_.grad_pieces();
  if (!shards_.reduce_scatter()) {
    keep_mine(f.bucket, f.sums);
    if (stream_norm_) norm_.add(bucket.offset, f.sums.data_ptr<float>(), f.sums.numel());
  } else {
    // The reduce-scatter wrote the first s values of the piece; the last rank's piece also holds the
    // values left over, all-reduced in the bucket's buffer.
    const int64_t s = layout_.piece_size(f.bucket), main = s * layout_.world;
    if (layout_.rank == layout_.world - 1 && main < bucket.numel)
      dst.narrow(0, piece_at(f.bucket) + s, bucket.numel - main).copy_(f.sums.narrow(0, main, bucket.numel - main));
  }
  // f.sums dropped here: the bucket's buffer freed.
}

void PieceReduction::start() { sync_ = start_grad_sync(comm_, flat_, model_, bucket_mb_, reduce(), reduce_name()); }

void PieceReduction::before_backward(const MicroStep& m) {
  if (m.last() && stream_norm_) norm_.reset();  // the buckets complete during this backward
  if (!batch_) return sync_->begin(m.last());
  batch_->seed(m);
  last_ = m.last();
  sync_->begin(/*sync=*/true);  // every micro-batch's buckets go into the trees
}

void PieceReduction::after_micro_backward(const MicroStep& m) {
  // dist.invariant: the buckets no hook launched (parameters without a gradient: zeros) pushed too,
  // so every bucket's tree has a leaf per micro-batch. The last one's are after_backward's.
  if (batch_ && !m.last()) sync_->finish(m.step);
}

void PieceReduction::after_backward(int64_t step) {
  sync_->finish(step);  // launches the buckets no hook launched; their work is ours
  while (!in_flight_.empty()) complete_oldest();
}

torch::Tensor PieceReduction::grad_norm(int64_t step) {
  if (stream_norm_) return torch::full({}, norm_.result(), flat_.options());
  // From the pieces: their sums of squares all-reduced.
  auto total = flat_.grad_pieces().numel() > 0 ? flat_.grad_pieces().pow(2).sum() : torch::zeros({}, flat_.options());
  comm_.all_reduce_sum(total, strf("all-reduce of the gradient norm's pieces at step %lld", (long long)step));
  return total.sqrt();
}

nlohmann::json PieceReduction::record() const {
  nlohmann::json j = {{"world_size", layout_.world}, {"bucket_mb", bucket_mb_}, {"reduce", reduce_name()}};
  if (batch_) {
    j["invariant"] = true;
    batch_->record(j);
    j["combine"] = combine_name(combine_);
  }
  return j;
}

std::string PieceReduction::invariant_line() const {
  if (!batch_) return "";
  return "invariant: " + batch_->describe() + "; each bucket's sums in a tree stash per micro-batch, at the last one " +
         combine_line(combine_, layout_.buckets.size(), static_cast<double>(flat_.numel()) * 4 / 1e6, layout_.world) + "; ";
}

std::string PieceReduction::describe(int64_t state_bytes, const std::string& what) const {
  const double owned = static_cast<double>(layout_.owned_numel()), all = static_cast<double>(flat_.numel());
  const double elem = static_cast<double>(flat_.options().dtype().itemsize());
  return invariant_line() + strf("zero-2: rank %d keeps the summed gradients and %s; gradients %.1f MB of %.1f MB; "
              "gradients %s, norm %s, weights all-gathered after each update",
              layout_.rank, shards_.describe(state_bytes, what, flat_.numel()).c_str(), owned * elem / 1e6,
              all * elem / 1e6,
              batch_ ? "added in the tree (dist.invariant)"
              : shards_.reduce_scatter() ? "reduce-scattered" : "all-reduced (the backend has no reduce-scatter: the same sums)",
              stream_norm_ ? "streamed bucket by bucket (the bits of the flat norm)"
                    : "from the pieces");
}

}  // namespace lm
