// The streaming loader (see loader.h for the sample order, batching and resume rules): the stages
// composed. ShardSet (shards.h) checks and holds the split's shards (one set per source), Planner
// (plan.h) plans the sample stream and each batch's rows (MixPlanner, mix.h, blends a mixture's
// sources), Workers (workers.h) build batches ahead on threads, and state.h fingerprints the sample
// order for resuming; which planner runs, and the run's data facts, are the data form's (form.h).
// Also the sources' opening.
#include "data/loader/loader.h"

#include <algorithm>
#include <functional>

#include "data/loader/form.h"
#include "data/loader/mix.h"
#include "data/loader/plan.h"
#include "data/loader/shards.h"
#include "data/loader/state.h"
#include "data/loader/workers.h"
#include "data/format/shard.h"
#include "data/remote/store.h"
#include "data/text/text_source.h"
#include "common/checksum.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"

namespace lm::data {

namespace {

// batches_left's work bound: samples planned (a packed sample costs ~0.1 us to plan).
constexpr uint64_t kCountSamples = uint64_t{20} << 20;

// Checks the arguments before anything is opened: the data.* options name their key (ConfigError).
const DataConfig& checked(const DataConfig& c, int64_t seq_len, int64_t micro_batch, int rank, int world) {
  validate(c, seq_len);
  if (seq_len < 1 || micro_batch < 1 || world < 1 || rank < 0 || rank >= world)
    throw Error(strf("Loader: bad seq_len %lld, micro_batch %lld or rank %d of %d", static_cast<long long>(seq_len),
                     static_cast<long long>(micro_batch), rank, world));
  return c;
}

}  // namespace

struct Loader::Impl {
  // Built in this order; each may throw (loader.h, the constructors' contract).
  std::vector<std::unique_ptr<ShardSet>> sets;
  PlannedStream stream;  // the data form's planner, fingerprint and answers (form.h)
  std::unique_ptr<Workers> workers;
  bool bucketed = false;

  // The units the manifest tells (a remote dataset's shards are then not fetched at start): packed,
  // tokens + docs; bucketed, one sample per document (prep writes no empty document; checked when
  // the shard is first opened); bucketed with long_docs split, none: a document's samples depend on
  // its length, which only the shard holds.
  void open(const DataConfig& c, const Manifest& m, const std::string& split, int64_t seq_len) {
    ShardSet::ListedUnits listed = [](const ShardInfo& s) { return s.tokens + s.docs; };
    if (c.bucketed()) listed = c.split_long_docs() ? ShardSet::ListedUnits() : [](const ShardInfo& s) { return s.docs; };
    const bool bucketed = c.bucketed(), split_docs = c.split_long_docs();
    sets.push_back(std::make_unique<ShardSet>(
        m, split, c.verify_full(),
        [bucketed, split_docs, seq_len](const ShardReader& s) { return stream_units(s, bucketed, split_docs, seq_len); },
        listed));
  }
  // Remote datasets: a shuffle block's stretch of the stream (packed: its windows) and what follows.
  void plan_ahead(const DataConfig& c, int64_t seq_len, uint64_t shuffle_block) {
    const uint64_t block = shuffle_block * static_cast<uint64_t>(c.bucketed() ? 1 : seq_len) + 1;
    for (auto& s : sets)
      s->plan_ahead(s->max_span(block), static_cast<size_t>(c.remote_ahead), static_cast<size_t>(c.workers) + 1);
  }
  void start_workers(const DataConfig& c, int64_t seq_len, const Manifest& m) {
    std::vector<const ShardSet*> v;
    for (auto& s : sets) v.push_back(s.get());
    workers = std::make_unique<Workers>(c, v, *stream.planner, seq_len, m.tokenizer.eos_id, m.tokenizer.pad_id,
                                        static_cast<uint32_t>(m.tokenizer.vocab_size));
    workers->start(0, 0, stream.planner->mix_state());
  }
};

Loader::Loader(const DataConfig& cfg, const std::vector<Manifest>& sources, const std::string& split, int64_t seq_len,
               int64_t micro_batch, int rank, int world_size, uint64_t seed, int64_t micro_per_step, bool step_blocks)
    : impl_(std::make_unique<Impl>()) {
  const DataConfig& c = checked(cfg, seq_len, micro_batch, rank, world_size);
  if (c.sources.empty() || sources.size() != c.sources.size())
    throw Error("Loader: needs one dataset per data.sources entry");
  for (const auto& m : sources) impl_->open(c, m, split, seq_len);
  const Manifest& first = sources[0];
  impl_->bucketed = c.bucketed();
  if (step_blocks && c.bucketed() && c.token_budget > 0)
    throw Error("Loader: step blocks (dist.invariant) need micro-batches of micro_batch rows (no data.token_budget)");
  std::vector<const ShardSet*> sets;
  for (const auto& s : impl_->sets) sets.push_back(s.get());
  impl_->stream = data_form(c).plan(c, sets, sources, {split, seq_len, micro_batch, rank, world_size, seed, micro_per_step,
                                                       step_blocks ? std::max<int64_t>(1, micro_per_step) : 0});
  impl_->plan_ahead(c, seq_len, impl_->stream.shuffle_block);
  impl_->start_workers(c, seq_len, first);
}

Loader::~Loader() {
  if (impl_->workers) impl_->workers->stop();
}

Batch Loader::next() { return impl_->workers->next(); }

double Loader::last_wait_ms() const { return impl_->workers->last_wait_ms(); }

int64_t Loader::samples_per_epoch() const { return static_cast<int64_t>(impl_->stream.samples_per_epoch); }

LoaderState Loader::state() const {
  LoaderState s;
  s.version = kLoaderStateVersion;
  auto r = impl_->workers->returned();
  s.batches = r.batches, s.cursor = r.cursor, s.mix = r.mix ? r.mix->to_json() : "";
  s.fingerprint = impl_->stream.fingerprint;
  impl_->stream.planner->save(s);
  return s;
}

uint64_t Loader::batches_left(uint64_t limit, bool force) const {
  if (!impl_->stream.counter) return limit;  // data without end (one stream)
  // Bucketed samples' lengths come from the shards: not fetched (remote) or tokenized (raw text) for a count.
  for (const auto& s : impl_->sets)
    if (s->remote() && impl_->bucketed) return limit;
  auto p = impl_->stream.counter();
  const LoaderState s = state();
  if (s.batches > 0) p->restart(s, force);  // a resumed position
  return p->batches_left(limit, kCountSamples);
}

void Loader::rewind_to(uint64_t batches) { impl_->workers->rewind_to(batches); }

void Loader::load_state(const LoaderState& s, bool force) {
  auto version = [](const Fingerprint& f) {
    auto it = std::find_if(f.begin(), f.end(), [](const auto& kv) { return kv.first == "data_version"; });
    return it == f.end() ? std::string() : it->second;
  };
  const PlannedStream& ours = impl_->stream;
  const std::string theirs = version(s.fingerprint);
  // Other data (checkpoint.force): one stream starts afresh; a mixture forces per source (mix.h).
  if (force && ours.fresh_on_other_data && !theirs.empty() && theirs != version(ours.fingerprint)) {
    log::warn("other data than the checkpoint's (checkpoint.force): the data order starts from the beginning");
    return;
  }
  check_resumable(s, ours.fingerprint);
  impl_->workers->stop();
  ours.planner->restart(s, force);
  impl_->workers->start(s.batches, s.cursor, ours.planner->mix_state());
}

// ---- sources -----------------------------------------------------------------------------------

namespace {

// A prepared dataset (local or remote), or raw text when `text` names how it holds documents.
Manifest open_source(const DataConfig& cfg, const std::string& path, const std::string& text, const std::string& field,
                     const std::string& key) {
  if (text.empty()) return open_dataset(path, key, remote_options(cfg));
  TextSourceOptions o;
  o.text.docs = text, o.text.text_field = field;
  o.text.val_fraction = cfg.val_fraction, o.text.split_seed = static_cast<uint64_t>(cfg.split_seed);
  o.tokenizer = cfg.tokenizer, o.cache_dir = cfg.cache_dir, o.ahead_threads = static_cast<int>(cfg.workers);
  return open_text_dataset(path, key, o);
}

}  // namespace

TrainData open_train_data(const DataConfig& cfg) {
  if (cfg.sources.empty()) throw ConfigError("key 'data.train': not set (nor data.sources)");
  const DataForm& form = data_form(cfg);
  TrainData d;
  for (size_t i = 0; i < cfg.sources.size(); ++i) {
    const SourceConfig& s = cfg.sources[i];
    d.sources.push_back(open_source(cfg, s.path, s.text, s.text_field, form.source_key(cfg, i)));
    d.names.push_back(s.name);
    const auto& a = d.sources.front().tokenizer;
    const auto& b = d.sources.back().tokenizer;
    if (a.hash != b.hash)
      throw DataError(strf("data.sources: source '%s' (%s) has tokenizer %s %s, source '%s' (%s) has %s %s; all sources "
                           "must share one tokenizer", cfg.sources[0].name.c_str(), cfg.sources[0].path.c_str(),
                           a.kind.c_str(), a.hash.c_str(), s.name.c_str(), s.path.c_str(), b.kind.c_str(), b.hash.c_str()));
  }
  form.describe(cfg, d);
  return d;
}

uint64_t TrainData::train_tokens() const {
  uint64_t n = 0;
  for (const auto& m : sources) n += m.split_tokens("train");
  return n;
}

std::string TrainData::describe() const {
  const Manifest& m = sources.at(0);
  return strf("data: %s, %llu train tokens, data version %s, tokenizer %s", m.dir.c_str(),
              (unsigned long long)m.split_tokens("train"), m.data_version.c_str(), tokenizer().kind.c_str());
}

void TrainData::save_tokenizer(const std::string& dir) const {
  Manifest m;
  m.tokenizer = tokenizer();
  m.dtype = dtype_for_vocab(m.tokenizer.vocab_size) == TokenDtype::kU16 ? "uint16" : "uint32";
  m.data_version = compute_data_version({}, m.tokenizer.hash);
  files::make_dirs(dir);
  if (!m.tokenizer.file.empty()) files::write_file_atomic(dir + "/" + m.tokenizer.file, tokenizer_model());
  files::write_file_atomic(dir + "/manifest.json", m.to_json());
}

std::string TrainData::tokenizer_model() const {
  const Manifest& m = sources.at(0);
  const TokenizerInfo& t = m.tokenizer;
  if (t.file.empty()) return "";
  const std::string where = m.dir + "/" + t.file;
  std::string bytes = m.source ? m.source->read_file(t.file) : files::read_file(where);
  if (const std::string got = hex64(xxh64(bytes.data(), bytes.size())); got != t.hash)
    throw DataError(where + ": checksum " + got + " does not match the tokenizer hash of manifest.json (" + t.hash + ")");
  return bytes;
}

}  // namespace lm::data
