// The one contract of a stateful component (model, optimizer, EMA, scheduler, progress, metric
// windows, loader, RNG streams): its state out, its state in, with one signature, as torchtitan's
// components do. The checkpoint registry (checkpoint/state.h) binds each component to a fixed key;
// the components know nothing of checkpoints, files or keys, so optim/, runtime/ and telemetry/ do
// not depend on checkpoint/.
#pragma once

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace lm {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// One component's state: small values as JSON, tensors by name (either may be empty). Saved, the
// tensors are in `tensors`. Loaded from a checkpoint, they come as `shards`, each call reading some
// of them, so a component holds one call's at a time while it keeps what it needs: a sharded
// component (each rank saves its own part of it: an optimizer the parallelism shards) gets every
// part the run that saved it wrote, one part per call (the world size may have changed); a whole
// component's file comes one tensor per call.
struct ComponentState {
  nlohmann::json values = nlohmann::json::object();
  NamedTensors tensors;
  std::vector<std::function<NamedTensors()>> shards = {};  // (= {}: aggregate initialisations may leave it out)
  // Every tensor at once: `tensors`, then each shard's, read now (for small states and tests).
  NamedTensors all_tensors() const {
    NamedTensors out = tensors;
    for (const auto& read : shards)
      for (auto& t : read()) out.push_back(std::move(t));
    return out;
  }
};

class Stateful {
 public:
  virtual ~Stateful() = default;
  // The component's state now (tensors may be views of its own: the caller copies what it keeps).
  virtual ComponentState state() const = 0;
  // Restores what state() gave. `st` is nullptr only for a component registered as optional whose
  // checkpoint has no state for it (written before it existed, or with it off): the component says
  // what that means. Throws CheckpointError naming what does not fit.
  virtual void load_state(const ComponentState* st) = 0;
};

// Asked by a component before it writes state that an asynchronous checkpoint may still be copying
// out of it (the parameters, the optimizer moments, the EMA): the checkpoint writer implements it
// (trainer/checkpoint/writer.h), so the fence lives with what it guards, never in the training loop.
class WriteFence {
 public:
  virtual ~WriteFence() = default;
  virtual void before_write() = 0;
};

}  // namespace lm
