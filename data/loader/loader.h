// The streaming training data loader: one split of a prepared dataset, shuffled, cut into packed
// windows or length-bucketed documents, partitioned over data-parallel ranks, built ahead of the
// trainer by worker threads, with an exact, versioned resume state.
//
// THE SAMPLE STREAM (the same on every rank; it never depends on worker count or prefetch depth)
//   Epoch e visits the split's shards in a permutation drawn from (seed, e); the epoch's token stream
//   is their documents in that order, each followed by tokenizer.eos_id.
//   packed:   sample j of an epoch is the window stream[j*T, j*T+T+1) (T = seq_len); consecutive
//             windows overlap by one token, so every token is a target exactly once per epoch.
//             N = floor((L-1)/T) samples per epoch (L = stream length, the same every epoch); the
//             tail of fewer than T tokens after the last window is not used.
//   bucketed: a sample is one document plus its EOS, truncated to T+1 tokens (long_docs=truncate) or
//             cut into windows of T+1 at stride T (split); empty documents give no sample.
//   Shuffle: the epoch's N samples are cut into blocks of shuffle_buffer samples and each block is
//   permuted from (seed, epoch, block): the mixing of a streaming shuffle buffer of that size, but
//   random-access, so the state holds no buffer contents. The epochs' samples, concatenated, are one
//   endless stream; the cursor counts samples of it.
//
// BATCHES (G = world_size * micro_batch samples per global batch)
//   packed:   global batch k = the next G samples of the stream; rank r takes rows [r*B, (r+1)*B).
//             There is no remainder rule: a batch that meets the end of an epoch continues into the
//             next one. Every row holds T targets, so ranks are balanced by construction.
//   bucketed: each block is sorted by length (longest first, stable) and cut into global batches
//             whose order inside the block is shuffled from (seed, epoch, block). Within a global
//             batch samples are sorted longest first and dealt to ranks round-robin (rank r takes
//             rows r, r+W, r+2W, ...), so the ranks' token counts differ by at most one sample.
//             Fixed size (token_budget = 0): every rank gets exactly micro_batch rows. Batch
//             boundaries lie on a grid of G samples; a block's first and last pieces that do not fill
//             a whole batch straddle into the neighbouring block (the stream goes on, no sample is
//             lost or repeated). Token budget: inside a block, batches of W*k samples with k*padded
//             <= token_budget, k as large as fits; a batch never crosses a block, the block's last
//             batch takes the rest (ranks get k or k+1 rows within the budget; if the budget is below
//             2*seq_len a rank can get 0 rows at a block's end).
//             Step blocks (dist.invariant, Loader's step_blocks): batches are cut and sorted as at
//             world size 1 and each rank takes whole ones (see there).
//             Padding: to the longest sample of the rank's batch minus one, rounded up to
//             pad_multiple (at most T); inputs padded with tokenizer.pad_id, targets with -1.
//
// RESUME: state() is the position after the last batch returned; load_state() continues exactly.
//   The state's fingerprint (data_version, split, mode, seq_len, seed, shuffle, shuffle_buffer, and
//   long_docs in bucketed mode) must match or load_state throws DataError naming the field.
//   World size and micro batch (and token_budget, pad_multiple) may change: the new loader continues
//   at the same cursor, so over the whole stream no sample is repeated or skipped. In bucketed mode
//   the batch layout shapes the order, so the block interrupted by such a change keeps the order it
//   was cut with (saved in the state) and later blocks follow the new layout.
//
// MIXTURES (data.sources; data.train is the one-source form "train", planned exactly as above)
//   Each source is its own sample stream as above (its own epochs, shard order and shuffles, seeded
//   from (seed, its name)) with its own cursor. The global stream takes each next sample from the
//   source furthest behind its target share of the TOKENS (mix.h), so the choice is a function of
//   the weights, the seed and the position only. A global batch is the next G samples of it:
//   packed, rank r takes rows [r*B, (r+1)*B); bucketed, the batch is sorted longest first and dealt
//   round-robin (no cross-batch length bucketing with a mixture: sorting across batches would move
//   tokens between steps and break the per-step shares). With token_budget, G is the next samples
//   taken W at a time while k = G/W rows per rank fit k * padded(longest) <= budget (at least W).
//   Stages (data.stages) switch the weights at a batch boundary. A source at the end of an epoch
//   starts the next one reshuffled (logged); at max_epochs it drops out and the weights renormalise
//   over the rest (logged). Batch::source_tokens counts the global batch's tokens per source.
//   Resume: the state holds every source's cursor by name, so weights, stages and appended sources
//   may change at a resume (the new mixture starts at the resumed batch; no document of any source
//   is repeated or skipped within its epoch); the tokenizer, a source's data version, and removing
//   a source that was read are refused (DataError naming it) unless force.
//
// Threads: next(), state(), load_state() are for one consumer thread. Workers open shards through
// mmap (file-backed pages), at most 16 per worker and source (a shuffle block of small shards spans
// many; remote datasets hold one); memory is O(prefetch batches + shuffle_buffer + shards), never
// O(dataset).
//
// This is the loader's one public header. Inside, by stage: shards.h (the split's checked shards),
// plan.h (the sample stream and each batch's rows), workers.h (threads, prefetch queue, reading
// through token_walk.h), state.h (fingerprint; LoaderState JSON).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "data/loader/data_config.h"
#include "data/format/manifest.h"

namespace lm::data {

// The step blocks' deal (dist.invariant; the Loader's step_blocks): a step's W x per_rank global
// micro-batches are dealt to the ranks in contiguous blocks, rank r holding [r*per_rank,
// (r+1)*per_rank) and its k-th micro-batch of the step being global micro-batch first + k. The one
// definition of the deal: the planner, the invariant strategy's dropout seeds and its meta.json
// record (trainer/parallel/invariant.h), and data-inspect read it here.
struct StepBlock {
  int64_t first = 0, last = 0;  // [first, last)
  int64_t at(int64_t k) const { return first + k; }
};
inline StepBlock step_block(int rank, int64_t per_rank) {
  return {static_cast<int64_t>(rank) * per_rank, (static_cast<int64_t>(rank) + 1) * per_rank};
}

// Where a row's sample starts: shard index in the manifest's `shards`, document in that shard, token
// offset in the document (== its length: the sample starts at the document's EOS).
struct SampleOrigin {
  uint32_t shard = 0;
  uint64_t doc = 0;
  uint64_t offset = 0;
  uint32_t source = 0;  // a mixture: index in data.sources (shard indexes that source's manifest)
  bool operator==(const SampleOrigin& o) const {
    return shard == o.shard && doc == o.doc && offset == o.offset && source == o.source;
  }
};

// One rank's share of one global batch. inputs/targets are (rows, cols) row-major.
struct Batch {
  int64_t rows = 0, cols = 0;           // this rank's B and padded T
  std::vector<int64_t> inputs, targets; // rows*cols each; targets -1 at padding
  int64_t target_tokens = 0;            // targets != -1
  int64_t pad_tokens = 0;               // padded input positions
  uint64_t hash = 0;                    // xxh64 of this rank's unpadded sample tokens (uint32 LE), in row order
  int64_t epoch = 0;                    // epoch of the global batch's first sample
  uint64_t index = 0;                   // batch number in the stream (0-based)
  std::vector<SampleOrigin> origins;    // one per row
  std::vector<int64_t> source_tokens;   // target tokens of the whole GLOBAL batch per source (all ranks)
};

// How bucketed batches are cut (part of the resume state; unused in packed mode).
struct BatchLayout {
  int64_t ranks = 1;         // world size; 1 under step blocks (dist.invariant: micro-batches cut whole)
  int64_t rows = 0;          // fixed size: rows per rank; 0 = token budget
  int64_t token_budget = 0;  // budget mode: padded tokens per rank
  int64_t pad_multiple = 1;  // budget mode: rounding of the padded length
  uint64_t anchor = 0;       // fixed size: batches start at anchor + k*ranks*rows of the stream
};

struct LoaderState {
  int version = 1;
  uint64_t cursor = 0;   // samples of the global stream consumed by all ranks together
  uint64_t batches = 0;  // batches returned
  std::vector<std::pair<std::string, std::string>> fingerprint;  // what fixes the sample order
  BatchLayout layout;        // bucketed: the layout in use
  BatchLayout block_layout;  // bucketed: the layout that ordered the block holding the cursor
  std::string mix;           // a mixture: its state (JSON: sources' cursors, segment; mix.h); "" for one source

  // The state as a JSON value (what a checkpoint's rank file holds under "loader") and as text.
  // from_*: throws DataError ("loader state: ...") on a malformed state or an unknown version.
  nlohmann::json to_value() const;
  static LoaderState from_value(const nlohmann::json& value);
  std::string to_json() const { return to_value().dump(); }
  static LoaderState from_json(const std::string& text);
};

class Loader {
 public:
  // The loader of cfg's training data: sources[i] is the dataset of cfg.sources[i] (TrainData::
  // sources). The data's form (form.h: data.train's one stream or a mixture) picks the planner;
  // micro_per_step is train.grad_accum (a mixture's stages are given in optimizer steps).
  // Validates the split (every shard's header and sizes against the manifest, checksums when
  // verify=full) and throws DataError naming the file on any problem, before starting workers.
  // Bad option values throw ConfigError naming the data.* key (validate(), data_config.h).
  // step_blocks (dist.invariant; data.train, packed or bucketed without token_budget): the
  // micro_per_step global batches of a step are dealt as contiguous blocks instead: the step's
  // W*micro_per_step micro-batches of micro_batch samples are the next samples of the stream in
  // order, global micro-batch i being samples [i*B, (i+1)*B) of the step at any world size, and rank
  // r's k-th next() returns global micro-batch r*micro_per_step + k (resumes land on step
  // boundaries). Bucketed, the blocks are cut into micro-batches of B samples (the layout's ranks is
  // 1: the stream of a 1-rank run), each sorted longest first and taken whole by one rank, so its
  // rows and padding are the same at any world size.
  // REQUIRES: 0 <= rank < world_size; sources.size() == cfg.sources.size().
  Loader(const DataConfig& cfg, const std::vector<Manifest>& sources, const std::string& split, int64_t seq_len,
         int64_t micro_batch, int rank, int world_size, uint64_t seed, int64_t micro_per_step = 1,
         bool step_blocks = false);
  ~Loader();  // stops and joins the workers, also while they wait on a full queue
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // Blocks for the next batch. An error met by a worker (e.g. a corrupt shard) is rethrown here,
  // in batch order, as the exception the worker caught (DataError naming the shard); it is sticky.
  Batch next();
  double last_wait_ms() const;  // how long the last next() blocked
  LoaderState state() const;
  // After next() failed (e.g. RemoteError): state() describes the position when `batches` batches
  // had been returned (LoaderState::batches; one of the last 1024), so that a checkpoint taken now
  // resumes at the failed step's first micro-batch. The loader is not read again after this.
  void rewind_to(uint64_t batches);
  // Restarts the pipeline at `s`. Throws DataError naming the field when `s` was made for other
  // data or another sample order (see RESUME above).
  // force (checkpoint.force): a mixture continues despite a changed or removed source (mix.h); one
  // stream whose state is of another data version starts from the beginning (warned).
  void load_state(const LoaderState& s, bool force = false);
  int64_t samples_per_epoch() const;  // a mixture: its first source's
  // Whole global batches the stream holds from state() on, counted up to `limit`: fewer only when
  // the plan shows a mixture's data to end first (every source with a weight at its max_epochs,
  // stages included). `limit` where the data never ends (one stream; a stage with an uncapped
  // source), where the count would read shards (bucketed remote or raw-text sources) or take long.
  // force: as load_state's. Throws DataError as the loader would when it reached bad data.
  uint64_t batches_left(uint64_t limit, bool force = false) const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// A config's training data, opened: for every data form (prepared or raw text, local or remote,
// data.train or a mixture) THE answer to which tokenizer, vocabulary, data version and validation
// split a run has.
// Its form (data.train or a mixture, form.h) is settled when it is opened: the facts below are
// answers, and nothing that reads them asks which form runs.
struct TrainData {
  std::vector<Manifest> sources;   // cfg.sources' datasets, in order (data.train: the one "train")
  std::vector<std::string> names;  // cfg.sources' names
  std::string version;             // the run's data version id: one stream's data_version; a mixture,
                                   // the xxh64 hex over every source's name, data_version, weight and
                                   // max_epochs and every stage
  // What a resume compares with the checkpoint's data version: one stream's version; "" for a
  // mixture, whose sources the loader state checks one by one (weights and stages may change).
  std::string resume_version;
  // meta.json's data.mixture: the sources (name, path, data_version, weight, max_epochs, train
  // tokens), the stages and the version; null for data.train.
  nlohmann::json mixture;

  const TokenizerInfo& tokenizer() const { return sources.at(0).tokenizer; }
  int64_t vocab_size() const { return static_cast<int64_t>(tokenizer().vocab_size); }
  // The dataset whose "val" split validates the run when data.val is empty: the first source.
  const Manifest& val_source() const { return sources.at(0); }
  uint64_t train_tokens() const;  // the sources' "train" splits together
  // "data: DIR, N train tokens, data version V, tokenizer T" (the first source's) for the log.
  std::string describe() const;
  // The tokenizer's model file bytes (sentencepiece; "" for bytes), checked against its hash,
  // wherever the dataset lives (a local directory, a URL, the .model of raw text).
  std::string tokenizer_model() const;
  // The tokenizer as a dataset without shards at `dir` (manifest.json and the model file), which
  // Manifest::load and load_tokenizer_isolated read: what a run directory carries (run/run_dir.h), so
  // that export and generate work after the data is gone.
  void save_tokenizer(const std::string& dir) const;
};

// Opens every source of cfg (Manifest::load, open_dataset for URLs, open_text_dataset for raw
// text). Throws DataError naming both sources when their tokenizer hashes differ.
TrainData open_train_data(const DataConfig& cfg);

}  // namespace lm::data
