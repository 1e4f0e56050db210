// The optimizer seam: what the step, the checkpoints and the memory check ask of an optimizer,
// whichever `optim.name` runs. An optimizer updates a FlatParams (flat_params.h), all of it or the
// ranges the parallelism gives this rank (trainer/parallel/parallel.h), and owns its state under
// the checkpoint key "optimizer" (Stateful).
//
// Adding one: a class implementing Optimizer (its own header and .cpp in trainer/optim/), a row in
// optimizer_kinds() (optim_config.h: its name, state bytes per parameter, and what it can do: a
// fused kernel, grad_scale, freed gradients, whole parameters), its case in make_optimizer
// (optimizer.cpp), and its keys in OptimConfig. Nothing else names it: the gradient path and the
// parallel layout ask the row.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/optim/flat_params.h"
#include "run/config/optim_config.h"
#include "common/torch/stateful.h"

namespace lm {

class Optimizer : public Stateful {
 public:
  // One update at learning rate lr. found_inf (optional): a 0-dim float32 tensor on the parameters'
  // device; where it holds 1 the step is skipped entirely (weights, state and step count unchanged).
  virtual void step(double lr, const torch::Tensor& found_inf = {}) = 0;
  // Asked before every update writes the parameters and the state (nullptr: none).
  virtual void set_fence(WriteFence* f) = 0;
  // True when the update is gated on the device (found_inf read there, no host sync): the loop may
  // then read a step's results one step late (StepUpdate).
  virtual bool gated_on_device() const = 0;
  // Updates taken so far (skipped ones not counted).
  virtual int64_t steps() const = 0;
  // Bytes of state this rank holds.
  virtual int64_t state_bytes() const = 0;
  // What the state is, for the start-up line ("the AdamW moments").
  virtual std::string state_name() const = 0;
};

// The optimizer optim.name names over `flat`. owned: the ranges of the flat buffer this rank updates
// and keeps state for (the parallelism's; nullopt: all of it). Throws ConfigError naming the key
// for a setting this optimizer refuses here.
std::unique_ptr<Optimizer> make_optimizer(FlatParams& flat, const OptimConfig& cfg,
                                          std::optional<std::vector<FlatRange>> owned = std::nullopt);

}  // namespace lm
