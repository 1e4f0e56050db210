// The loader's resume state (internal to data/loader): the fingerprint of the sample order and the
// check that a saved LoaderState may continue this run. LoaderState's JSON is in state.cpp too.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/loader/data_config.h"
#include "data/loader/loader.h"

namespace lm::data {

constexpr int kLoaderStateVersion = 1;

using Fingerprint = std::vector<std::pair<std::string, std::string>>;

// What fixes the sample order (loader.h, RESUME): data_version, split, mode, seq_len, seed,
// shuffle, shuffle_block (the shuffle_buffer in effect), and long_docs in bucketed mode.
Fingerprint make_fingerprint(const DataConfig& c, const std::string& data_version, const std::string& split,
                             int64_t seq_len, uint64_t seed, uint64_t shuffle_block);

// Throws DataError ("loader state: ...") when `s` has another version, or lacks or differs on a
// field of `ours` (naming the field, both values).
void check_resumable(const LoaderState& s, const Fingerprint& ours);

}  // namespace lm::data
