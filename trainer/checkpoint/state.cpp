// The component registry (see state.h).
#include "trainer/checkpoint/state.h"

#include <map>
#include <vector>

#include "common/errors.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/optim/flat_state.h"

namespace lm {

ComponentState ModuleState::state() const {
  if (part_) {  // the slices, and each parameter's shape for readers that put them together (weights_reader.h)
    nlohmann::json shapes = nlohmann::json::object();
    for (const auto& [name, t] : module_tensors(m_)) shapes[name] = t.sizes().vec();
    return {{{"shapes", shapes}}, flat_slices(*flat_, *part_, flat_->params(), "", /*indexed=*/!flat_->weights_packed())};
  }
  return {{}, module_tensors(m_)};
}

void ModuleState::load_state(const ComponentState* st) {
  // Kept in parts (part_: ZeRO-3), only this rank's pieces are copied in: it never holds them all.
  const std::vector<FlatRange>* only = part_ ? &*part_ : nullptr;
  if (flat_) {  // whole or in slices, a tensor (or a part) at a time
    std::map<std::string, std::vector<int64_t>> shapes;
    for (const auto& [name, t] : module_tensors(m_)) shapes[name] = t.sizes().vec();
    auto checked = [this, &shapes](NamedTensors ts) {  // a whole tensor in its parameter's shape
      for (const auto& [name, t] : ts)
        if (auto it = shapes.find(name); it != shapes.end()) check_tensor_shape(what_ + ".safetensors", name, t, it->second);
      return ts;
    };
    ComponentState in{st->values, checked(st->tensors)};
    for (const auto& read : st->shards) in.shards.push_back([&read, &checked] { return checked(read()); });
    return load_flat_values(*flat_, flat_->params(), in, what_, only, /*packed=*/flat_->weights_packed());
  }
  const NamedTensors all = st->all_tensors();
  for (const auto& [name, t] : all)
    if (name.find('[') != std::string::npos)
      throw CheckpointError(what_ + ": the weights are saved in parts; this reader takes them whole only");
  load_into_module(m_, all, what_ + ".safetensors");  // whole, in the parameters' shapes
}

void StateRegistry::add(const std::string& key, Scope scope, Stateful& c, bool optional) {
  for (const auto& e : entries_)
    if (e.key == key) throw Error("state key '" + key + "' registered twice");
  entries_.push_back({key, scope, &c, optional});
}

CheckpointState StateRegistry::snapshot(int64_t step, nlohmann::json run) const {
  CheckpointState st;
  st.step = step;
  st.run = std::move(run);
  for (const auto& e : entries_) {
    auto& part = e.scope == Scope::kReplicated ? st.replicated : e.scope == Scope::kSharded ? st.sharded : st.per_rank;
    part[e.key] = e.component->state();
  }
  return st;
}

void StateRegistry::restore(const CheckpointState& st, const std::string& where) const {
  for (const auto& e : entries_) {
    const bool whole = e.scope == Scope::kReplicated || e.scope == Scope::kSharded;  // loaded, both are whole
    const auto& part = whole ? st.replicated : st.per_rank;
    auto it = part.find(e.key);
    if (it == part.end() && !e.optional) throw CheckpointError(where + ": has no state for '" + e.key + "'");
    const bool others = e.scope == Scope::kOwnRank && st.saved_rank != st.loaded_rank;
    e.component->load_state(it == part.end() || others ? nullptr : &it->second);
  }
}

}  // namespace lm
