// The random streams of one rank: LibTorch's default CPU generator (dropout, init) and, on CUDA,
// the device generator. Seeded once for identical initialisation on every rank, then per rank.
#pragma once

#include <torch/torch.h>

#include <cstdint>

#include "common/torch/stateful.h"

namespace lm {

class RngStreams : public Stateful {
 public:
  explicit RngStreams(const torch::Device& device) : device_(device) {}
  // The same seed on every rank: identical model initialisation.
  void seed_shared(uint64_t seed) const;
  // Each rank's own stream (dropout) derived from the seed and the rank.
  void seed_rank(uint64_t seed, int rank) const;
  // State under "rng" (per rank): {"cpu": hex bytes, "cuda": hex bytes on CUDA}.
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  torch::Device device_;
};

}  // namespace lm
