// What a checkpoint holds, component by component. Every stateful part of a run (model, optimizer,
// scheduler, EMA, progress, metric windows, loader, RNG streams) is a Stateful (common/torch/stateful.h)
// that saves and loads its OWN state; a StateRegistry binds each one to a fixed key, and the
// checkpoint composes them by name. Nothing else knows a component's keys.
//
// Files of a checkpoint (format version 2; see layout.h for the commit protocol):
//   <key>.safetensors  a replicated component's tensors (model, optimizer, ema)        rank 0
//   <key>.part_<r>.safetensors  rank r's part of a sharded component's tensors (the
//                      optimizer a parallelism shards; ZeRO-3's weights and EMA;
//                      slices "<param>[a:b]", trainer/optim/flat_state.h; values in state.json)  every rank
//   state.json         {"magic", "version", "step", "world_size", "run": {...},
//                       "components": {<key>: <values>}} for the replicated components  rank 0
//   rank_<r>.json      {"rank", "components": {<key>: <values>}} for the per-rank ones  every rank
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "trainer/checkpoint/safetensors.h"
#include "common/torch/stateful.h"
#include "trainer/optim/flat_params.h"

namespace lm {

// The fixed keys.
namespace state_key {
constexpr const char* kModel = "model";
constexpr const char* kOptimizer = "optimizer";
constexpr const char* kScheduler = "scheduler";
constexpr const char* kEma = "ema";
constexpr const char* kProgress = "progress";
constexpr const char* kMetrics = "metrics";          // logging window and run totals
constexpr const char* kAnomaly = "anomaly";          // the anomaly detector's running mean
constexpr const char* kLongWindow = "long_window";   // the metrics sink's long-window aggregates
constexpr const char* kLoader = "loader";
constexpr const char* kSourceTokens = "source_tokens";  // realised tokens per data source
constexpr const char* kRng = "rng";
constexpr const char* kParallel = "parallel";  // what the parallelism strategy keeps (parallel.h)
}  // namespace state_key

// A module's parameters and buffers by name (module_tensors: views), loaded back in place; the
// model under "model". `what` names the component's files in messages (without ".safetensors"). With `flat` (the module's parameters as
// one flat buffer) and `part` (the ranges of it this rank saves, its own part of a sharded
// component: the parallelism's weights_part(), ZeRO-3's pieces), the state is the slices of those
// ranges ("<param>[a:b]", trainer/optim/flat_state.h). Either form loads, and so do the parts of a
// sharded checkpoint (read one at a time, all of the weights kept: REQUIRES flat).
class ModuleState : public Stateful {
 public:
  ModuleState(torch::nn::Module& m, std::string what, FlatParams* flat = nullptr,
              std::optional<std::vector<FlatRange>> part = std::nullopt)
      : m_(m), what_(std::move(what)), flat_(flat), part_(std::move(part)) {}
  ComponentState state() const override;
  void load_state(const ComponentState* st) override;

 private:
  torch::nn::Module& m_;
  std::string what_;
  FlatParams* flat_;
  std::optional<std::vector<FlatRange>> part_;
};

// What one rank contributes to, or gets back from, a checkpoint.
struct CheckpointState {
  int64_t step = 0;
  // What the run was made from (config, arch, data_version, code): checked at resume, not loaded.
  nlohmann::json run = nlohmann::json::object();
  std::map<std::string, ComponentState> replicated;  // the same on every rank; written by rank 0
  std::map<std::string, ComponentState> per_rank;    // this rank's own
  // Saved: this rank's part of each sharded component. Loaded: a sharded component is in
  // `replicated`, its values with every part the saving run wrote as ComponentState::shards.
  std::map<std::string, ComponentState> sharded;
  int saved_rank = 0;   // loaded: the rank that wrote per_rank (another one when the world grew)
  int loaded_rank = 0;  // loaded: the rank that read it
};

// The run's stateful components under their keys. snapshot() asks each for its state; restore()
// hands each its part, in registration order (so later components may depend on earlier ones).
class StateRegistry {
 public:
  // kReplicated: the same on every rank. kPerRank: each rank's own; a rank the checkpoint has none
  // for (the world grew) gets rank 0's (the loader: its cursor is global). kOwnRank: each rank's
  // own or nothing: a rank that would get another rank's is handed nullptr (the RNG streams).
  // kSharded: one state cut into parts, each rank saving its own (an optimizer the parallelism shards); every
  // rank is handed every part (ComponentState::shards) and keeps what it owns now, at any world
  // size. A replicated state and a sharded one load into either kind of component.
  enum class Scope { kReplicated, kPerRank, kOwnRank, kSharded };

  // `c` under `key`; an optional component is handed nullptr when a checkpoint has no state for
  // it, a required one is refused. REQUIRES: `key` not registered yet; `c` outlives the registry.
  void add(const std::string& key, Scope scope, Stateful& c, bool optional = false);
  CheckpointState snapshot(int64_t step, nlohmann::json run) const;
  // Throws CheckpointError naming `where` and the key when a required component is missing.
  void restore(const CheckpointState& st, const std::string& where) const;

 private:
  struct Entry {
    std::string key;
    Scope scope;
    Stateful* component;
    bool optional;
  };
  std::vector<Entry> entries_;
};

}  // namespace lm
