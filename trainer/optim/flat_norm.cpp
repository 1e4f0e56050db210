#include "trainer/optim/flat_norm.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace lm {
namespace {

// lanes[(offset + i) % kLanes] += x[i]^2 for the k values of one chunk, in increasing offsets.
void accumulate(double* lanes, int64_t offset, const float* x, int64_t k) {
  constexpr int L = FlatNorm::kLanes;
  int64_t i = 0;
  for (; i < k && (offset + i) % L != 0; ++i) {
    const double v = x[i];
    lanes[(offset + i) % L] += v * v;
  }
  double acc[L];
  for (int j = 0; j < L; ++j) acc[j] = lanes[j];
  for (; i + L <= k; i += L)
    for (int j = 0; j < L; ++j) {
      const double v = x[i + j];
      acc[j] += v * v;
    }
  for (int j = 0; j < L; ++j) lanes[j] = acc[j];
  for (; i < k; ++i) {
    const double v = x[i];
    lanes[(offset + i) % L] += v * v;
  }
}

double lanes_sum(const double* lanes) {
  double s = lanes[0];
  for (int j = 1; j < FlatNorm::kLanes; ++j) s = s + lanes[j];
  return s;
}

}  // namespace

void FlatNorm::reset() {
  chunk_ = -1, at_ = 0, total_ = 0;
  std::fill(lanes_, lanes_ + kLanes, 0.0);
}

void FlatNorm::close_chunk() {
  if (chunk_ < 0) return;
  total_ = total_ + lanes_sum(lanes_);
  std::fill(lanes_, lanes_ + kLanes, 0.0);
  chunk_ = -1;
}

void FlatNorm::add(int64_t offset, const float* x, int64_t k) {
  TORCH_CHECK(offset >= at_, "FlatNorm: range at ", offset, " fed after one ending at ", at_,
              " (ranges must come in increasing offsets)");
  while (k > 0) {
    const int64_t c = offset / kChunk;
    if (c != chunk_) {
      close_chunk();
      chunk_ = c;
    }
    const int64_t n = std::min(k, (c + 1) * kChunk - offset);
    accumulate(lanes_, offset, x, n);
    offset += n, x += n, k -= n;
  }
  at_ = offset;
}

double FlatNorm::squares() const { return chunk_ >= 0 ? total_ + lanes_sum(lanes_) : total_; }

float FlatNorm::result() const { return static_cast<float>(std::sqrt(squares())); }

float FlatNorm::of(const torch::Tensor& v) { return static_cast<float>(std::sqrt(squares_of(v))); }

double FlatNorm::squares_of(const torch::Tensor& v) {
  TORCH_CHECK(v.is_cpu() && v.scalar_type() == torch::kFloat && v.is_contiguous(),
              "FlatNorm::squares_of: a contiguous float32 CPU tensor");
  const int64_t n = v.numel(), chunks = (n + kChunk - 1) / kChunk;
  const float* x = v.data_ptr<float>();
  std::vector<double> sums(static_cast<size_t>(chunks));
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double lanes[kLanes] = {};
      const int64_t at = c * kChunk;
      accumulate(lanes, at, x + at, std::min(kChunk, n - at));
      sums[static_cast<size_t>(c)] = lanes_sum(lanes);
    }
  });
  double total = 0;
  for (double s : sums) total = total + s;
  return total;
}

}  // namespace lm
