// The data's form (internal to data/loader): THE one place below the config where data.train and
// a mixture differ. The config loader gives data.train as the one-source mixture "train" with
// DataConfig::train_form set (resolve_train_form, data_config.h); data_form() reads that flag, here
// and nowhere else, and its answer decides which planner runs and what the run's data facts are.
// The Loader and open_train_data (loader.cpp) ask it once; what they hand on (the Loader's
// fingerprint and state, TrainData's version, resume_version and mixture) no longer knows the form.
//
//   data.train (OneStream): one Planner (plan.h) seeded by the run's seed, fingerprinted with the
//     dataset's data_version and the shuffle block it took; the run's data version is that
//     data_version and a resume compares it; meta.json has no mixture; checkpoint.force over a state
//     of other data starts the order afresh. Exactly as before mixtures existed (loader.h).
//   data.sources (Mixture): a MixPlanner (mix.h) over the sources, fingerprinted as "mixture"; the
//     run's data version hashes every source's name, data_version, weight, max_epochs and every
//     stage; a resume compares no version (the loader state checks the sources one by one: weights
//     and stages may change); meta.json records the sources and stages; the data can end
//     (Loader::batches_left counts on a planner of its own).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "data/loader/data_config.h"
#include "data/loader/loader.h"
#include "data/loader/mix.h"
#include "data/loader/plan.h"
#include "data/loader/shards.h"
#include "data/loader/state.h"

namespace lm::data {

// What the Loader plans the stream of (its constructor's arguments).
struct StreamArgs {
  std::string split;
  int64_t seq_len = 0, micro_batch = 0;
  int rank = 0, world = 1;
  uint64_t seed = 0;
  int64_t micro_per_step = 1;
  // > 0 (dist.invariant; the Loader's step_blocks): a step's global micro-batches dealt to the ranks
  // in contiguous blocks of this many (Planner's and MixPlanner's step_block).
  int64_t step_block = 0;
};

// The planned sample stream as the Loader keeps it, whatever the form.
struct PlannedStream {
  std::unique_ptr<BatchPlanner> planner;
  Fingerprint fingerprint;         // what fixes the sample order (state.h)
  uint64_t samples_per_epoch = 0;  // a mixture: its first source's
  uint64_t shuffle_block = 0;      // samples a remote source's read-ahead covers
  // A quiet planner of its own that counts the batches left (Loader::batches_left); null where the
  // data never ends.
  std::function<std::unique_ptr<MixPlanner>()> counter;
  // checkpoint.force over a state of other data: the order starts afresh (else the planner's
  // restart decides what force tolerates).
  bool fresh_on_other_data = false;
};

class DataForm {
 public:
  virtual ~DataForm() = default;
  // The key naming source i of c in errors.
  virtual std::string source_key(const DataConfig& c, size_t i) const = 0;
  // d.version, d.resume_version and d.mixture from c and d.sources (opened, in c's order).
  virtual void describe(const DataConfig& c, TrainData& d) const = 0;
  // The stream over sets[i], the split of sources[i] (c.sources[i]).
  virtual PlannedStream plan(const DataConfig& c, const std::vector<const ShardSet*>& sets,
                             const std::vector<Manifest>& sources, const StreamArgs& a) const = 0;
};

// THE choice: data.train's one stream or a mixture of data.sources.
const DataForm& data_form(const DataConfig& c);

}  // namespace lm::data
