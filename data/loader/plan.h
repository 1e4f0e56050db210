// The loader's planning stage (internal to data/loader): the sample stream of loader.h (each
// epoch's shard order, the shuffle blocks, the bucketed block tables) and, for each global batch,
// this rank's rows as cheap references (stream positions and documents; no token is read here).
// The rules are loader.h's; the workers (workers.h) read the tokens.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "data/loader/data_config.h"
#include "data/loader/loader.h"
#include "data/loader/shards.h"

namespace lm::data {

// A sample of the bucketed stream: tokens [offset, offset+len) of the document followed by its EOS
// (the EOS is included iff offset + len == doc length + 1).
struct Ref {
  uint32_t shard = 0;  // index in the split
  uint32_t len = 0;    // tokens, >= 2
  uint64_t doc = 0, offset = 0;
};

// One epoch's shard order and where each shard starts in the epoch, in units: stream tokens
// (packed: tokens + one EOS per document) or samples (bucketed).
struct EpochTable {
  std::vector<uint32_t> order;  // split shard indices
  std::vector<uint64_t> start;  // order.size() + 1 prefix sums
};

// A mixture's state (mix.h) after a batch, shared and immutable: copied once per batch, turned
// into JSON only when a loader state is taken.
struct MixState;
using MixSnapshot = std::shared_ptr<const MixState>;

// This rank's rows of one global batch.
struct Plan {
  struct Row {
    const EpochTable* epoch = nullptr;  // packed: the window at stream offset `pos` of this epoch
    uint64_t pos = 0;
    Ref ref;                            // bucketed: the sample
    uint32_t source = 0;                // the mixture's source (index in data.sources)
  };
  uint64_t cursor_after = 0;  // the stream cursor after the global batch
  int64_t epoch = 0;          // epoch of the global batch's first sample
  std::vector<Row> rows;
  std::vector<std::shared_ptr<const EpochTable>> keep;  // owners of the rows' epoch tables
  std::vector<int64_t> source_tokens;  // target tokens of the whole global batch, per source
  MixSnapshot mix_after;               // a mixture: its state after this batch (mix.h); null for one source
};

// What the workers plan batches with: the one-source Planner below, or the MixPlanner (mix.h).
class BatchPlanner {
 public:
  virtual ~BatchPlanner() = default;
  // This rank's rows of the next global batch.
  virtual Plan next() = 0;
  // Fills the layout fields of a state at s.cursor (see Planner::save).
  virtual void save(LoaderState& s) const = 0;
  // Plans on from s (loader.h, RESUME). force: checkpoint.force (a mixture tolerates changed sources).
  virtual void restart(const LoaderState& s, bool force) = 0;
  // A mixture's state where planning stands now (null for one source); valid after construction
  // or restart(), before next().
  virtual MixSnapshot mix_state() const { return nullptr; }
};

// What a shard contributes to an epoch: packed, its stream tokens; bucketed, its samples.
uint64_t stream_units(const ShardReader& s, bool bucketed, bool split_docs, int64_t seq_len);

// Padded row length of a bucketed sample of `len` tokens (its row holds len-1 inputs).
int64_t padded(int64_t len, int64_t multiple, int64_t seq_len);

// Plans the batches of one rank, in stream order. Not thread-safe: the workers call next() under
// their lock; save() may run beside it (see there).
class Planner : public BatchPlanner {
 public:
  // `set` holds stream_units() of its shards. Throws DataError naming the directory and split when
  // the split holds no sample (packed: fewer than seq_len+1 stream tokens).
  // step_block > 0 (Loader's step_blocks; packed, or bucketed without token budget): a step of
  // step_block global batches is dealt in contiguous blocks, rank r's k-th batch of the step being
  // global micro-batch r*step_block + k. Bucketed, the blocks are cut into micro-batches of
  // micro_batch rows (the layout's ranks is 1), each taken whole by one rank.
  Planner(const DataConfig& c, const ShardSet& set, int64_t seq_len, int64_t micro_batch, int rank, int world,
          uint64_t seed, int64_t step_block = 0);
  Planner(const Planner&) = delete;
  Planner& operator=(const Planner&) = delete;

  uint64_t samples_per_epoch() const { return n_; }
  uint64_t shuffle_block() const { return S_; }  // shuffle_buffer, at most one epoch
  // This rank's rows of the next global batch; the cursor moves past the whole global batch.
  // Throws DataError when a restored bucketed cursor is not at a batch boundary of its block.
  Plan next() override;
  // Fills s.layout and s.block_layout for a state at s.cursor (a cursor next() has passed). Reads
  // only what restart() sets, so it may run while another thread is in next().
  void save(LoaderState& s) const override;
  // Plans on from s.cursor with s's layouts (loader.h, RESUME); forgets every table.
  // REQUIRES: no thread is in next().
  void restart(const LoaderState& s, bool force = false) override;

  // As one source of a mixture: sample i of this stream as a row (packed: its window; bucketed: the
  // sample in its shuffle block's permuted order, not sorted or cut) and its target tokens. Rows
  // keep their epoch tables alive through p.keep. forget_before(i) drops the tables behind sample i.
  Plan::Row sample(uint64_t i, Plan& p, int64_t* tokens);
  void forget_before(uint64_t i);
  // A remote or raw-text source: tells it the shards the stream reads from sample i on (ShardSet::
  // read_ahead), as next() does for one source.
  void read_ahead_from(uint64_t i);

 private:
  static constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  // A bucketed block in stream order, with, in token-budget mode, the positions where its batches start.
  struct BlockTable {
    uint64_t start = 0;  // stream index of order[0]
    std::vector<Ref> order;
    std::vector<size_t> cuts;
  };
  struct Walker {  // bucketed: position of unshuffled sample j of an epoch
    int64_t epoch = -1;
    uint64_t j = 0, doc = 0, k = 0;
    size_t p = 0;
  };

  // Global block g: block g % blocks_per_epoch_ of epoch g / blocks_per_epoch_.
  uint64_t block_of(uint64_t i) const { return i / n_ * blocks_per_epoch_ + i % n_ / S_; }
  uint64_t block_start(uint64_t g) const { return g / blocks_per_epoch_ * n_ + g % blocks_per_epoch_ * S_; }
  uint64_t block_size(uint64_t g) const { return std::min(S_, n_ - g % blocks_per_epoch_ * S_); }

  std::shared_ptr<const EpochTable> epoch_table(int64_t e);
  const std::vector<uint32_t>& block_perm(uint64_t g);
  void normalize(const EpochTable& ep);
  std::vector<Ref> unshuffled(int64_t e, uint64_t j0, uint64_t count);
  std::vector<size_t> budget_cuts(const std::vector<Ref>& v, size_t pos, const BatchLayout& l) const;
  void order_block(BlockTable& t, const std::vector<Ref>& v, const BatchLayout& l, uint64_t g) const;
  const BlockTable& block(uint64_t g);
  // Step blocks: this call's micro-batch index in the step, the stream index of the step's first
  // sample (the cursor without step blocks), and the first sample of rank's micro-batch of this call.
  uint64_t in_step() const;
  uint64_t step_start() const;
  uint64_t micro_first(int rank) const;
  void next_packed(Plan& p);
  void next_bucketed(Plan& p);
  std::vector<uint32_t> upcoming(uint64_t cursor, size_t k);

  // ---- fixed after construction
  const ShardSet& set_;
  bool bucketed_, split_docs_, shuffle_;
  int64_t T_, B_;
  int rank_, world_;
  uint64_t seed_;
  int64_t step_block_;  // 0: off
  uint64_t n_ = 0;  // samples per epoch
  uint64_t S_ = 1;  // shuffle block
  uint64_t blocks_per_epoch_ = 1;
  BatchLayout own_;  // this run's layout (anchor 0)

  // ---- set by restart()
  uint64_t cursor_ = 0;  // next sample of the stream to plan
  uint64_t step_anchor_ = 0;  // step_block_: a step boundary (where planning began or resumed)
  BatchLayout layout_;   // in use
  uint64_t held_block_ = kNone, held_pos_ = 0;  // a block ordered by held_layout_, entered at held_pos_
  BatchLayout held_layout_;

  // ---- tables ahead of the cursor
  std::map<int64_t, std::shared_ptr<const EpochTable>> epochs_;
  std::map<uint64_t, std::vector<uint32_t>> perms_;  // packed block permutations
  std::map<uint64_t, BlockTable> blocks_;            // bucketed block tables
  std::map<uint64_t, std::vector<Ref>> permuted_;    // bucketed blocks, permuted only (sample())
  ShardCache shards_;
  Walker walker_;
};

}  // namespace lm::data
