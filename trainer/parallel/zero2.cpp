// ZeRO-2: the gradients of each bucket reduced and kept as this rank's pieces (see zero2.h).
#include "trainer/parallel/zero2.h"

#include <cmath>
#include <cstring>
#include <random>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "common/log.h"

namespace lm {

namespace {

// acc[j] += x[b*lanes + j]^2 for `blocks` blocks of `lanes` values, fused or not.
void square_blocks_scalar(float* acc, const float* x, int64_t blocks, int lanes, bool fused) {
  for (int64_t b = 0; b < blocks; ++b, x += lanes)
    for (int j = 0; j < lanes; ++j) {
      if (fused) {
        acc[j] = std::fma(x[j], x[j], acc[j]);
      } else {
        const float sq = x[j] * x[j];  // no FMA in this target: not contracted
        acc[j] = acc[j] + sq;
      }
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void square_blocks_fma(float* acc, const float* x, int64_t blocks, int lanes) {
  // lanes is 8 or 16: one or two 8-float accumulators, each lane exactly as std::fma would.
  __m256 a0 = _mm256_loadu_ps(acc), a1 = lanes == 16 ? _mm256_loadu_ps(acc + 8) : _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, x += lanes) {
    const __m256 v0 = _mm256_loadu_ps(x);
    a0 = _mm256_fmadd_ps(v0, v0, a0);
    if (lanes == 16) {
      const __m256 v1 = _mm256_loadu_ps(x + 8);
      a1 = _mm256_fmadd_ps(v1, v1, a1);
    }
  }
  _mm256_storeu_ps(acc, a0);
  if (lanes == 16) _mm256_storeu_ps(acc + 8, a1);
}
#endif

void square_blocks(float* acc, const float* x, int64_t blocks, int lanes, bool fused) {
#if defined(__x86_64__)
  static const bool has_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (fused && has_fma && (lanes == 8 || lanes == 16)) return square_blocks_fma(acc, x, blocks, lanes);
#endif
  square_blocks_scalar(acc, x, blocks, lanes, fused);
}

}  // namespace

void NormStream::reset(int64_t n) {
  n_ = n, main_ = n - n % lanes_, at_ = 0;
  acc_.assign(lanes_, 0.f);
  tail_.clear();
}

void NormStream::add(const float* x, int64_t k) {
  auto one = [&](float v) {
    if (at_ < main_) {
      float& a = acc_[at_ % lanes_];
      if (fused_) {
        a = std::fma(v, v, a);
      } else {
        const float sq = v * v;
        a = a + sq;
      }
    } else {
      tail_.push_back(v);
    }
    ++at_;
  };
  int64_t i = 0;
  for (; i < k && at_ % lanes_ != 0; ++i) one(x[i]);  // up to a lane boundary
  if (at_ < main_) {
    const int64_t blocks = std::min(k - i, main_ - at_) / lanes_;
    square_blocks(acc_.data(), x + i, blocks, lanes_, fused_);
    i += blocks * lanes_, at_ += blocks * lanes_;
  }
  for (; i < k; ++i) one(x[i]);
}

float NormStream::result() const {
  float b = acc_[0];
  for (int j = 1; j < lanes_; ++j) b = b + acc_[j];
  for (float v : tail_) {
    if (fused_) {
      b = std::fma(v, v, b);
    } else {
      const float sq = v * v;
      b = b + sq;
    }
  }
  return std::sqrt(b);
}

std::unique_ptr<NormStream> NormStream::matching_torch(int64_t also) {
  // A generator of its own: the global one (dropout, init) is not touched.
  std::mt19937 gen(12345);
  std::vector<int64_t> sizes = {7, 100, 1001, 65537, 1000003};
  if (also > 0 && also <= (int64_t{1} << 22)) sizes.push_back(also);
  std::vector<torch::Tensor> vecs;
  for (int64_t n : sizes) {
    auto t = torch::empty({n}, torch::kFloat);
    std::normal_distribution<float> d(0.f, n % 2 ? 1.f : 1e-3f);
    float* p = t.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) p[i] = d(gen);
    vecs.push_back(t);
  }
  for (int lanes : {8, 16})
    for (bool fused : {true, false}) {
      auto s = std::make_unique<NormStream>(lanes, fused);
      bool all = true;
      for (auto& t : vecs) {
        s->reset(t.numel());
        const int64_t half = t.numel() / 3;  // fed in two ranges, as buckets are
        s->add(t.data_ptr<float>(), half);
        s->add(t.data_ptr<float>() + half, t.numel() - half);
        const float mine = s->result(), theirs = t.norm().item<float>();
        if (std::memcmp(&mine, &theirs, sizeof(float)) != 0) {
          all = false;
          break;
        }
      }
      if (all) return s;
    }
  return nullptr;
}

Zero2::Zero2(const ParallelInit& init) : Zero1(init) {
  TORCH_CHECK(flat_.path().pieces, "Zero2: the flat parameters need GradPath::pieces (parallel.h grads_in_pieces)");
  flat_.keep_grad_pieces(owned_);
  // Where each bucket's piece sits in the packed buffer (owned_ leaves empty pieces out).
  int64_t at = 0;
  const auto& entries = flat_.entries();
  size_t e = 0;
  for (size_t b = 0; b < layout_.buckets.size(); ++b) {
    piece_at_.push_back(at);
    at += layout_.piece(b, layout_.rank).numel;
    const auto& bucket = layout_.buckets[b];
    const size_t first = e;
    while (e < entries.size() && entries[e].offset < bucket.offset + bucket.numel) ++e;
    entries_of_.emplace_back(first, e);
  }
  if (!reduce_scatter_ && flat_.params().is_cpu()) {
    norm_ = NormStream::matching_torch(flat_.numel());
    if (!norm_)
      log::warn("zero-2: no way of adding the squares gives LibTorch's own norm here; the gradient norm is taken "
                "from the pieces (the same within float rounding, not plain data parallelism's bits)");
  }
}

GradSync::Reduce Zero2::reduce() {
  return [this](size_t i, torch::Tensor) {
    while (in_flight_.size() >= kInFlight) complete_oldest();
    torch::NoGradGuard ng;
    const auto& bucket = layout_.buckets[i];
    // 0 + each gradient: what plain data parallelism's zeroed flat buffer holds after the backward.
    auto sums = torch::zeros({bucket.numel}, flat_.params().options());
    auto& tensors = flat_.tensors();
    const auto& entries = flat_.entries();
    for (size_t e = entries_of_[i].first; e < entries_of_[i].second; ++e) {
      auto& t = tensors[e];
      if (!t.grad().defined()) continue;  // no gradient this step: zeros, as in the flat buffer
      sums.narrow(0, entries[e].offset - bucket.offset, entries[e].numel).add_(t.grad().reshape({-1}));
      t.mutable_grad().reset();  // freed: the bucket's buffer holds it now
    }
    InFlight f{i, sums, {}};
    const int64_t s = layout_.piece_size(i), main = s * layout_.world;
    if (!reduce_scatter_) {
      f.work.push_back(comm_.all_reduce_async(sums));
    } else {
      auto mine = flat_.grad_pieces().narrow(0, piece_at_[i], s);
      if (s > 0) f.work.push_back(comm_.reduce_scatter_async(sums.narrow(0, 0, main), mine));
      if (main < bucket.numel) f.work.push_back(comm_.all_reduce_async(sums.narrow(0, main, bucket.numel - main)));
    }
    in_flight_.push_back(std::move(f));
    return std::vector<std::shared_ptr<Comm::Pending>>{};  // waited for here (complete_oldest), not by GradSync
  };
}

void Zero2::complete_oldest() {
  InFlight f = std::move(in_flight_.front());
  in_flight_.pop_front();
  for (auto& w : f.work)
    comm_.wait(w, strf("%s of gradient bucket %zu/%zu", reduce_name().c_str(), f.bucket + 1, layout_.buckets.size()));
  torch::NoGradGuard ng;
  const auto& bucket = layout_.buckets[f.bucket];
  const auto piece = layout_.piece(f.bucket, layout_.rank);
  auto dst = flat_.grad_pieces();
  if (!reduce_scatter_) {
    if (piece.numel > 0)
      dst.narrow(0, piece_at_[f.bucket], piece.numel).copy_(f.sums.narrow(0, piece.offset - bucket.offset, piece.numel));
    if (norm_) norm_->add(f.sums.data_ptr<float>(), f.sums.numel());
  } else {
    // The reduce-scatter wrote the first s values of the piece; the last rank's piece also holds the
    // values left over, all-reduced in the bucket's buffer.
    const int64_t s = layout_.piece_size(f.bucket), main = s * layout_.world;
    if (layout_.rank == layout_.world - 1 && main < bucket.numel)
      dst.narrow(0, piece_at_[f.bucket] + s, bucket.numel - main).copy_(f.sums.narrow(0, main, bucket.numel - main));
  }
  // f.sums dropped here: the bucket's buffer freed.
}

void Zero2::before_backward(const MicroStep& m) {
  if (m.last() && norm_) norm_->reset(flat_.numel());  // the buckets complete during this backward
  Zero1::before_backward(m);
}

void Zero2::after_backward(int64_t step) {
  sync_->finish(step);  // launches the buckets no hook launched; their work is ours
  while (!in_flight_.empty()) complete_oldest();
}

torch::Tensor Zero2::grad_norm(int64_t step) {
  if (norm_) return torch::full({}, norm_->result(), flat_.params().options());
  // From the pieces: their sums of squares all-reduced.
  auto total = flat_.grad_pieces().numel() > 0 ? flat_.grad_pieces().pow(2).sum() : torch::zeros({}, flat_.params().options());
  comm_.all_reduce_sum(total, strf("all-reduce of the gradient norm's pieces at step %lld", (long long)step));
  return total.sqrt();
}

std::string Zero2::describe(int64_t state_bytes, const std::string& what) const {
  const double owned = static_cast<double>(layout_.owned_numel()), all = static_cast<double>(flat_.numel());
  const double whole = owned > 0 ? static_cast<double>(state_bytes) * all / owned : 0;
  const double elem = static_cast<double>(flat_.params().element_size());
  return strf("zero-2: rank %d keeps the summed gradients and %s of %lld of %lld weights (%zu bucket pieces): "
              "gradients %.1f MB of %.1f MB, optimizer state %.1f MB of %.1f MB; gradients %s, norm %s, weights "
              "all-gathered after each update",
              layout_.rank, what.c_str(), (long long)layout_.owned_numel(), (long long)flat_.numel(), owned_.size(),
              owned * elem / 1e6, all * elem / 1e6, static_cast<double>(state_bytes) / 1e6, whole / 1e6,
              reduce_scatter_ ? "reduce-scattered" : "all-reduced (the backend has no reduce-scatter: the same sums)",
              norm_ ? strf("streamed as LibTorch's kernel adds it (%d lanes%s)", norm_->lanes(),
                           norm_->fused() ? ", fused multiply-add" : "").c_str()
                    : "from the pieces");
}

}  // namespace lm
