// The streaming loader (see loader.h for the sample order, batching and resume rules): the stages
// composed. ShardSet (shards.h) checks and holds the split's shards, Planner (plan.h) plans the
// sample stream and each batch's rows, Workers (workers.h) build batches ahead on threads, and
// state.h fingerprints the sample order for resuming.
#include "data/loader/loader.h"

#include <tuple>

#include "data/loader/plan.h"
#include "data/loader/shards.h"
#include "data/loader/state.h"
#include "data/loader/workers.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm::data {

struct Loader::Impl {
  // Members are built in this order; each may throw (loader.h, the constructor's contract).
  ShardSet set;
  Planner planner;
  Workers workers;
  Fingerprint fingerprint;

  Impl(const DataConfig& c, const Manifest& m, const std::string& split, int64_t seq_len, int64_t micro_batch,
       int rank, int world, uint64_t seed)
      : set(m, split, c.verify == "full",
            [&](const ShardReader& s) { return stream_units(s, c.mode == "bucketed", c.long_docs == "split", seq_len); }),
        planner(c, set, seq_len, micro_batch, rank, world, seed),
        workers(c, set, planner, seq_len, m.tokenizer.eos_id, m.tokenizer.pad_id, m.tokenizer.vocab_size),
        fingerprint(make_fingerprint(c, m.data_version, split, seq_len, seed, planner.shuffle_block())) {}
};

namespace {

// Checks the arguments before anything is opened: the data.* options name their key (ConfigError).
const DataConfig& checked(const DataConfig& c, int64_t seq_len, int64_t micro_batch, int rank, int world) {
  validate(c, seq_len);
  if (seq_len < 1 || micro_batch < 1 || world < 1 || rank < 0 || rank >= world)
    throw Error(strf("Loader: bad seq_len %lld, micro_batch %lld or rank %d of %d", static_cast<long long>(seq_len),
                     static_cast<long long>(micro_batch), rank, world));
  return c;
}

}  // namespace

Loader::Loader(const DataConfig& cfg, const Manifest& m, const std::string& split, int64_t seq_len,
               int64_t micro_batch, int rank, int world_size, uint64_t seed)
    : impl_(std::make_unique<Impl>(checked(cfg, seq_len, micro_batch, rank, world_size), m, split, seq_len, micro_batch,
                                   rank, world_size, seed)) {
  impl_->workers.start(0, 0);
}

Loader::~Loader() { impl_->workers.stop(); }

Batch Loader::next() { return impl_->workers.next(); }

double Loader::last_wait_ms() const { return impl_->workers.last_wait_ms(); }

int64_t Loader::samples_per_epoch() const { return static_cast<int64_t>(impl_->planner.samples_per_epoch()); }

LoaderState Loader::state() const {
  LoaderState s;
  s.version = kLoaderStateVersion;
  std::tie(s.batches, s.cursor) = impl_->workers.returned();
  s.fingerprint = impl_->fingerprint;
  impl_->planner.save(s);
  return s;
}

void Loader::load_state(const LoaderState& s) {
  check_resumable(s, impl_->fingerprint);
  impl_->workers.stop();
  impl_->planner.restart(s);
  impl_->workers.start(s.batches, s.cursor);
}

}  // namespace lm::data
