// The loader's data mixture (internal to data/loader; the rules are loader.h's MIXTURES): several
// sources, each its own sample stream (a Planner over its ShardSet, with its own epochs, shuffles
// and cursor), blended into one global stream by TOKENS, in stages.
//
// The choice: every sample of the global stream goes to the source furthest behind its target,
//   argmax_s  w_s * (segment_tokens + seq_len) - tokens_s   (ties: the lower index),
// over the sources with weight > 0 that have not reached their max_epochs, counting tokens since
// the segment began. A segment begins at the first batch, at each stage change, when a source
// reaches its cap (the weights renormalise over the rest) and at a resume whose mixture differs.
// The choice depends on nothing else (not on ranks, workers or prefetch), so every rank computes
// the same stream, and each source's share of the segment's tokens stays within about one sample
// (seq_len+1 tokens) of its weight.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/loader/data_config.h"
#include "data/loader/loader.h"
#include "data/loader/plan.h"
#include "data/loader/shards.h"

namespace lm::data {

// The mixture's position: LoaderState::mix (JSON). Sources by name, in config order.
struct MixState {
  struct Source {
    std::string name, data_version;
    uint64_t cursor = 0;     // samples of this source's stream consumed (over its epochs)
    int64_t tokens = 0;      // target tokens taken from it, whole run
    int64_t seg_tokens = 0;  // ... in the current segment
    double weight = 0;       // its normalised weight in the current segment
  };
  std::string tokenizer;  // the sources' tokenizer hash
  std::vector<Source> sources;
  int64_t stage = -2;      // the segment's stage (0-based); -1: no stages; -2: no segment yet
  uint64_t seg_start = 0;  // batch where the segment began
  int64_t seg_total = 0;   // target tokens in the segment
  int64_t total = 0;       // target tokens of the whole run

  std::string to_json() const;
  // Throws DataError ("loader state: ...") when malformed.
  static MixState from_json(const std::string& text);
};

// A source as the mixture sees it (the i-th of data.sources).
struct MixSource {
  const ShardSet* set = nullptr;
  std::string data_version;
};

class MixPlanner : public BatchPlanner {
 public:
  // Builds each source's stream (seed: xxh64 of (seed, xxh64(name))). micro_per_step: micro-batches
  // per optimizer step (train.grad_accum), for stages given in steps. Throws DataError naming a
  // source's directory when it holds no sample.
  // step_block > 0 (dist.invariant; the Loader's step_blocks, = micro_per_step): a step's W x A
  // micro-batches are the next W*A*B samples of the global stream, planned whole at the step's first
  // call (the stage decided at the step's start only: a stage's end in tokens is then the same step
  // at any world size), and rank r's k-th call of the step returns micro-batch r*A + k (bucketed: its
  // rows longest first). Fixed-size micro-batches only (no token budget).
  MixPlanner(const DataConfig& c, const std::vector<MixSource>& sources, const std::string& tokenizer_hash,
             int64_t seq_len, int64_t micro_batch, int rank, int world, uint64_t seed, int64_t micro_per_step,
             int64_t step_block = 0);

  Plan next() override;
  void save(LoaderState& s) const override;
  // Continues from s's mixture state with this config's sources, weights and stages. Throws
  // DataError naming what may not change (the tokenizer, a read source removed, a source's data
  // version) unless force, which warns and drops or restarts that source.
  void restart(const LoaderState& s, bool force) override;
  MixSnapshot mix_state() const override { return std::make_shared<const MixState>(st_); }
  // Whole global batches the stream holds from where planning stands, counted up to `limit`
  // (returned when the data lasts that long, or when that is not known within `max_samples`
  // samples planned). Plans quietly on this planner, which it leaves past them: call it on a planner
  // of its own (Loader::batches_left). Without a stage whose every weighted source has a
  // max_epochs, the data never ends: `limit` at once.
  uint64_t batches_left(uint64_t limit, uint64_t max_samples);
  void set_quiet() { quiet_ = true; }  // no log lines (a planner that only counts)
  uint64_t samples_per_epoch(size_t source) const { return streams_[source].n; }

 private:
  struct Stream {
    const SourceConfig* config;
    std::unique_ptr<Planner> planner;
    uint64_t n = 0;  // samples per epoch
  };
  int64_t stage_of(uint64_t batch, int64_t tokens_before) const;
  std::vector<double> weights_of(int64_t stage) const;  // normalised over the live sources; empty: none
  bool capped(size_t s) const;
  void begin_segment(int64_t stage, const std::string& why);
  size_t pick() const;
  Plan::Row take(size_t s, Plan& p, int64_t* tokens);
  uint64_t budget_rows();
  // The global stream's next n samples (the cursor moved past them); p gets their epoch tables, the
  // epoch of the first and the tokens per source; row_tokens (optional) each row's tokens.
  std::vector<Plan::Row> draw(uint64_t n, Plan& p, std::vector<int64_t>* row_tokens);
  void forget_and_read_ahead();  // each source's planner from its cursor on
  static void longest_first(std::vector<Plan::Row>& rows);  // stable
  std::vector<Plan::Row> plan_global(Plan& p);  // the global batch's rows, the state after it
  // The stage for the batch planned next; with step blocks decided at a step's start only.
  void enter_stage();
  // Step blocks: the step's W*A*B rows into step_ (the state after the step).
  void plan_step();
  Plan next_in_step();
  bool can_end() const;

  const DataConfig c_;  // a copy: streams_ point into c_.sources
  std::vector<Stream> streams_;
  bool bucketed_;
  int64_t T_, B_, accum_;
  int rank_, world_;
  BatchLayout own_;
  uint64_t cursor_ = 0, batches_ = 0;  // global stream samples and batches planned
  MixState st_;                        // after the last planned batch
  bool resumed_ = false;               // restart() was called and next() not yet
  bool quiet_ = false;                 // budget_rows() is trying samples, or batches_left() counts: no log lines
  bool exhausted_ = false;             // no source left to read (begin_segment threw)
  // Step blocks (step_block_ = A > 0): the planned step's rows in stream order, each row's target
  // tokens, what owns their epoch tables, the state after the step, and the calls served from it.
  int64_t step_block_ = 0;
  struct Step {
    std::vector<Plan::Row> rows;
    std::vector<int64_t> tokens;
    std::vector<std::shared_ptr<const EpochTable>> keep;
    int64_t epoch = 0;
    uint64_t start = 0;  // the global stream's cursor at the step's start
    MixSnapshot after;
    int64_t served = 0;  // calls answered from it (A: plan the next step)
  } step_;
};

}  // namespace lm::data
