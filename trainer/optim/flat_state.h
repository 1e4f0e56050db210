// Checkpoint state of buffers laid out as the flat parameters (the weights, the EMA, the AdamW
// moments), whole or in parts: one naming of their slices and one way to read them back, whatever
// cut the saving run made.
//
// Names: "<param>" is all of a parameter's values; "<param>[a:b]" is its values a..b-1 (flat, in
// the parameter's row-major order), what a rank that keeps only some ranges of the flat buffer
// saves (the sharded optimizer's moments, ZeRO-3's weights and EMA). A prefix ("exp_avg/") may come
// first.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <vector>

#include "common/torch/stateful.h"
#include "trainer/optim/flat_params.h"

namespace lm {

// A saved tensor's place in the flat buffer: values [begin, end) of parameter `entry`.
struct FlatSlice {
  const FlatParams::Entry* entry = nullptr;
  int64_t begin = 0, end = 0;
  int64_t offset() const { return entry->offset + begin; }  // where it starts in the flat buffer
  int64_t numel() const { return end - begin; }
};

// The slices of `values` over `ranges` (ascending, disjoint ranges of the flat buffer), cut at the
// parameters' edges, named prefix + "<param>[a:b]": views of `values`, which holds the ranges'
// values one after another (packed: the sharded moments), or is laid out as the whole flat buffer
// (indexed: the weights, the EMA).
NamedTensors flat_slices(const FlatParams& flat, const std::vector<FlatRange>& ranges, const torch::Tensor& values,
                         const std::string& prefix = "", bool indexed = false);

// Splits "<param>[a:b]" into its parameter and a, b; "<param>" gives b = -1 (all of it). false: a
// '[' ... ']' tail that is not a slice.
bool split_slice_name(const std::string& name, std::string* param, int64_t* a, int64_t* b);

// Parses a saved tensor's name (after `prefix`) against the flat parameters and checks `t` fits
// it. false: the name does not start with `prefix`. Throws CheckpointError naming `what` and the
// tensor for a name of no parameter, a malformed slice, or values that do not fit.
bool parse_flat_slice(const FlatParams& flat, const std::string& name, const torch::Tensor& t,
                      const std::string& prefix, const std::string& what, FlatSlice* out);

// Copies the values of slice `s` (`t`, any shape of its numel) into `values` where they fall in
// `ranges` (laid out as flat_slices lays them out: packed, or indexed), adding the count copied into
// each range to covered[i].
void copy_flat_slice(const std::vector<FlatRange>& ranges, torch::Tensor& values, const FlatSlice& s,
                     const torch::Tensor& t, std::vector<int64_t>* covered, bool indexed = false);

// After loading `copies` buffers laid out over `ranges` (the optimizer's moments: 2): throws
// CheckpointError naming `what` and the first range whose count in `covered` (copy_flat_slice's) is
// not copies x its values (a part missing, or parts overlapping).
void check_flat_coverage(const std::vector<FlatRange>& ranges, const std::vector<int64_t>& covered, int copies,
                         const std::string& what);

// A component's saved tensors (whole "<param>" or sliced, and the parts of a sharded one, read one
// at a time: ComponentState::shards) copied into `values`, laid out as the flat buffer: all of it,
// or only the values in `only` (a rank that keeps its pieces: the rest of `values` is not touched).
// Every value wanted must come exactly once: else CheckpointError naming `what` and the count.
// packed: `values` holds `only`'s values one after another (weights kept in pieces) instead.
void load_flat_values(const FlatParams& flat, torch::Tensor& values, const ComponentState& st, const std::string& what,
                      const std::vector<FlatRange>* only = nullptr, bool packed = false);

}  // namespace lm
