// The L2 norm of a flat float32 gradient vector on the CPU, defined by this project rather than by
// LibTorch's norm kernel, so that every parallelism computes it with the same bits: plain data
// parallelism over its whole flat buffer, ZeRO-2/3 bucket by bucket as the reductions complete, at
// any world size, with any LibTorch version, thread count or instruction set.
//
// The definition: the vector is cut into chunks of kChunk values by offset; in each chunk every square
// (exact in double: a float's square has at most 48 significant bits) is added into one of kLanes
// double accumulators, the lane the value's offset modulo kLanes, in increasing offsets; a chunk's
// sum is its lanes added left to right; the chunk sums are added in chunk order; the square root is
// taken in double and rounded to float. Zeros may be left out (adding +0 changes no sum), so a range
// that holds no gradient need not be fed. The products being exact, a fused multiply-add gives the
// same bits as a multiply then an add.
#pragma once

#include <torch/torch.h>

#include <cstdint>

namespace lm {

class FlatNorm {
 public:
  static constexpr int64_t kChunk = int64_t{1} << 16;
  static constexpr int kLanes = 8;

  // Fed range by range in increasing offsets (a gap between ranges is zeros): reset, add..., result.
  void reset();
  // REQUIRES: offset >= the end of the range added before (since reset).
  void add(int64_t offset, const float* x, int64_t k);
  float result() const;
  double squares() const;  // the sum of squares before the root (what the order of adding shows in)

  // The whole vector at once (contiguous float32 on the CPU), its chunks spread over LibTorch's
  // threads: the same bits as feeding it in any cut.
  static float of(const torch::Tensor& v);
  static double squares_of(const torch::Tensor& v);

 private:
  void close_chunk();
  int64_t chunk_ = -1, at_ = 0;  // the open chunk, the next offset
  double lanes_[kLanes] = {};
  double total_ = 0;
};

}  // namespace lm
