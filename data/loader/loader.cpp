// The streaming loader (see loader.h for the sample order, batching and resume rules).
//
// Pipeline: `workers` threads share one mutex-guarded planner. A worker takes the next batch number
// while fewer than `prefetch` batches are planned but not yet returned, asks the planner for that
// batch's rows (cheap: indices and shard offsets; in bucketed mode one block table of
// shuffle_buffer entries is built per block), then reads the tokens outside the lock. next() hands
// batches out strictly by number. A worker's exception is stored in its batch's slot and rethrown
// by next() when that batch is due.
#include "data/loader/loader.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "data/format/shard.h"
#include "common/errors.h"
#include "common/checksum.h"
#include "common/files.h"
#include "common/log.h"

namespace lm::data {
namespace {

constexpr int kStateVersion = 1;
constexpr size_t kOpenShards = 2;  // per worker, and for the planner
constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();

// The three shuffles draw from separate seeds (seed, epoch, [block,] salt).
enum Salt : uint64_t { kShardOrder = 1, kBlockPerm = 2, kBatchOrder = 3 };

// std::mt19937_64 is specified exactly by the standard; its seed is the xxh64 of the ints.
std::mt19937_64 rng_for(std::vector<uint64_t> ints) {
  return std::mt19937_64(xxh64(ints.data(), ints.size() * sizeof(uint64_t)));
}

// Fisher-Yates with an unbiased-enough multiply-high draw (std::shuffle and the distributions are
// implementation-defined; this is the same everywhere).
template <class T>
void shuffle(std::vector<T>& v, std::mt19937_64 g) {
  for (size_t i = v.size(); i > 1; --i)
    std::swap(v[i - 1], v[static_cast<size_t>((static_cast<unsigned __int128>(g()) * i) >> 64)]);
}

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

// A bucketed block in stream order, with the layout that ordered it and, in token-budget mode, the
// positions where its batches start.
struct BlockTable {
  uint64_t start = 0;  // stream index of order[0]
  std::vector<Ref> order;
  std::vector<size_t> cuts;
};

bool fixed_size(const BatchLayout& l) { return l.rows > 0; }
uint64_t global_rows(const BatchLayout& l) { return static_cast<uint64_t>(l.ranks * l.rows); }

// Same cuts, anchors aside (a user changed world size, micro batch or budget when false).
bool same_cuts(const BatchLayout& a, const BatchLayout& b) {
  if (fixed_size(a) != fixed_size(b)) return false;
  return fixed_size(a) ? global_rows(a) == global_rows(b)
                       : a.ranks == b.ranks && a.token_budget == b.token_budget && a.pad_multiple == b.pad_multiple;
}
// Same order of every block.
bool same_order(const BatchLayout& a, const BatchLayout& b) {
  return same_cuts(a, b) && (!fixed_size(a) || a.anchor % global_rows(a) == b.anchor % global_rows(b));
}

// Padded row length of a sample of `len` tokens (its row holds len-1 inputs).
int64_t padded(int64_t len, int64_t multiple, int64_t seq_len) {
  return std::min((len - 1 + multiple - 1) / multiple * multiple, seq_len);
}

uint64_t samples_of_doc(uint64_t len, bool split, int64_t seq_len) {
  if (len == 0) return 0;
  return split ? (len + seq_len - 1) / seq_len : 1;
}

using json = nlohmann::ordered_json;

json layout_json(const BatchLayout& l) {
  return {{"ranks", l.ranks}, {"rows", l.rows}, {"token_budget", l.token_budget},
          {"pad_multiple", l.pad_multiple}, {"anchor", l.anchor}};
}

// Per-shard facts and the lazy checksum state shared by the planner and all workers.
struct ShardSet {
  struct Entry {
    ShardInfo info;
    uint32_t manifest_index = 0;
    uint64_t units = 0;  // stream tokens (packed) or samples (bucketed)
    std::mutex mu;       // guards verified
    bool verified = false;
  };
  std::string dir, dtype;
  std::vector<std::unique_ptr<Entry>> shards;

  std::string path(size_t i) const { return dir + "/" + shards[i]->info.file; }
  void verify(size_t i) const {
    const std::string p = path(i), want = shards[i]->info.xxh64, got = hex64(xxh64_file(p));
    if (got != want) throw DataError(p + ": checksum " + got + " does not match manifest.json (" + want + ")");
  }
  // Opens shard i, checking its checksum on its first open (verify=lazy) and its header against the
  // manifest. Throws DataError naming the file.
  std::unique_ptr<ShardReader> open(size_t i) const {
    Entry& e = *shards[i];
    {
      std::lock_guard<std::mutex> lk(e.mu);
      if (!e.verified) verify(i);
      e.verified = true;
    }
    auto r = std::make_unique<ShardReader>(path(i));
    if (r->num_docs() != e.info.docs || r->num_tokens() != e.info.tokens ||
        (r->dtype() == TokenDtype::kU16) != (dtype == "uint16"))
      throw DataError(r->path() + ": does not match its entry in manifest.json (docs, tokens or dtype)");
    return r;
  }
};

// The few shards one thread has open, most recently used first.
class ShardCache {
 public:
  explicit ShardCache(const ShardSet& set) : set_(set) {}
  const ShardReader& get(uint32_t i) {
    auto it = std::find_if(open_.begin(), open_.end(), [&](const auto& p) { return p.first == i; });
    if (it == open_.end()) {
      if (open_.size() == kOpenShards) open_.pop_back();
      open_.insert(open_.begin(), {i, set_.open(i)});
    } else if (it != open_.begin()) {
      std::rotate(open_.begin(), it, it + 1);
    }
    return *open_.front().second;
  }
  void clear() { open_.clear(); }

 private:
  const ShardSet& set_;
  std::vector<std::pair<uint32_t, std::unique_ptr<ShardReader>>> open_;
};

}  // namespace

struct Loader::Impl {
  // One row of a planned batch: packed rows are a window start in an epoch's stream, bucketed
  // rows a Ref.
  struct Row {
    const EpochTable* epoch = nullptr;
    uint64_t pos = 0;
    Ref ref;
  };
  struct Plan {
    uint64_t cursor_after = 0;
    int64_t epoch = 0;
    std::vector<Row> rows;
    std::vector<std::shared_ptr<const EpochTable>> keep;  // owners of the rows' epoch tables
  };
  struct Slot {
    bool ready = false;
    uint64_t cursor_after = 0;
    Batch batch;
    std::exception_ptr error;
  };

  // ---- fixed after construction
  DataConfig cfg;
  bool bucketed, split_docs;
  int64_t T, B;
  int rank, world;
  uint64_t seed;
  uint32_t eos, pad;
  ShardSet set;
  uint64_t n = 0;               // samples per epoch
  uint64_t S = 1;               // shuffle block
  uint64_t blocks_per_epoch = 1;
  BatchLayout own;              // this run's layout (anchor 0)
  std::vector<std::pair<std::string, std::string>> fingerprint;

  // ---- pipeline, guarded by mu
  mutable std::mutex mu;
  std::condition_variable work_cv, ready_cv;
  std::map<uint64_t, Slot> slots;
  uint64_t planned = 0, returned = 0, cursor_returned = 0;
  bool stopping = false, failed = false;
  std::vector<std::thread> workers;
  double last_wait_ms = 0;

  // ---- planner, guarded by mu
  uint64_t cursor = 0;  // next sample of the stream to plan
  BatchLayout layout;   // in use
  uint64_t held_block = kNone, held_pos = 0;  // a block ordered by held_layout, entered at held_pos
  BatchLayout held_layout;
  std::map<int64_t, std::shared_ptr<const EpochTable>> epochs;
  std::map<uint64_t, std::vector<uint32_t>> perms;  // packed block permutations
  std::map<uint64_t, BlockTable> blocks;            // bucketed block tables
  std::unique_ptr<ShardCache> plan_shards;
  struct Walker {  // bucketed: position of unshuffled sample j of an epoch
    int64_t epoch = -1;
    uint64_t j = 0, doc = 0, k = 0;
    size_t p = 0;
  } walker;

  Impl(const DataConfig& c, const Manifest& m, const std::string& split, int64_t seq_len,
       int64_t micro_batch, int rank_, int world_, uint64_t seed_);

  uint64_t block_of(uint64_t i) const { return i / n * blocks_per_epoch + i % n / S; }
  uint64_t block_start(uint64_t g) const { return g / blocks_per_epoch * n + g % blocks_per_epoch * S; }
  uint64_t block_size(uint64_t g) const { return std::min(S, n - g % blocks_per_epoch * S); }

  std::shared_ptr<const EpochTable> epoch_table(int64_t e);
  const std::vector<uint32_t>& block_perm(uint64_t g);
  std::vector<Ref> unshuffled(int64_t e, uint64_t j0, uint64_t count);
  void normalize(const EpochTable& ep);
  const BlockTable& block(uint64_t g);
  std::vector<size_t> budget_cuts(const std::vector<Ref>& v, size_t pos, const BatchLayout& l) const;
  Plan plan();

  Batch build(const Plan& p, ShardCache& shards) const;
  void window(const EpochTable& ep, uint64_t pos, uint32_t* w, SampleOrigin* origin, ShardCache& shards) const;
  void sample(const Ref& r, uint32_t* w, ShardCache& shards) const;

  void start();
  void stop();
  void work();
};

Loader::Impl::Impl(const DataConfig& c, const Manifest& m, const std::string& split, int64_t seq_len,
                   int64_t micro_batch, int rank_, int world_, uint64_t seed_)
    : cfg(c), bucketed(c.mode == "bucketed"), split_docs(c.long_docs == "split"), T(seq_len),
      B(micro_batch), rank(rank_), world(world_), seed(seed_), eos(m.tokenizer.eos_id), pad(m.tokenizer.pad_id) {
  auto bad = [](const std::string& key, const std::string& why) { throw ConfigError("key 'data." + key + "': " + why); };
  if (c.mode != "packed" && c.mode != "bucketed") bad("mode", "must be packed or bucketed, got '" + c.mode + "'");
  if (c.long_docs != "truncate" && c.long_docs != "split") bad("long_docs", "must be truncate or split, got '" + c.long_docs + "'");
  if (c.verify != "lazy" && c.verify != "full") bad("verify", "must be lazy or full, got '" + c.verify + "'");
  if (c.workers < 1) bad("workers", "must be >= 1");
  if (c.prefetch < 1) bad("prefetch", "must be >= 1");
  if (c.shuffle_buffer < 1) bad("shuffle_buffer", "must be >= 1");
  if (c.pad_multiple < 1) bad("pad_multiple", "must be >= 1");
  if (c.token_budget < 0) bad("token_budget", "must be >= 0");
  if (bucketed && c.token_budget > 0 && c.token_budget < seq_len)
    bad("token_budget", strf("must be >= seq_len (%lld) so that one sample fits, got %lld",
                             static_cast<long long>(seq_len), static_cast<long long>(c.token_budget)));
  if (seq_len < 1 || micro_batch < 1 || world < 1 || rank < 0 || rank >= world)
    throw Error(strf("Loader: bad seq_len %lld, micro_batch %lld or rank %d of %d", static_cast<long long>(seq_len),
                     static_cast<long long>(micro_batch), rank, world));

  set.dir = m.dir;
  set.dtype = m.dtype;
  for (size_t i = 0; i < m.shards.size(); ++i) {
    if (m.shards[i].split != split) continue;
    auto e = std::make_unique<ShardSet::Entry>();
    e->info = m.shards[i];
    e->manifest_index = static_cast<uint32_t>(i);
    set.shards.push_back(std::move(e));
  }
  if (set.shards.empty()) throw DataError(m.dir + ": split '" + split + "' has no shards");
  const bool full = c.verify == "full";
  uint64_t units = 0;
  for (size_t i = 0; i < set.shards.size(); ++i) {  // one shard open at a time
    ShardSet::Entry& e = *set.shards[i];
    e.verified = true;  // open() skips the checksum here
    auto r = set.open(i);
    if (full) set.verify(i);
    if (bucketed)
      for (uint64_t d = 0; d < r->num_docs(); ++d) e.units += samples_of_doc(r->doc_length(d), split_docs, T);
    else
      e.units = r->num_tokens() + r->num_docs();
    e.verified = full;  // lazy: checked on the pipeline's first open
    units += e.units;
  }
  n = bucketed ? units : (units > 0 ? (units - 1) / static_cast<uint64_t>(T) : 0);
  if (n == 0 && bucketed) throw DataError(m.dir + ": split '" + split + "' has no sample (every document is empty)");
  if (n == 0)
    throw DataError(strf("%s: split '%s' is too short: %llu tokens (EOS included), fewer than seq_len+1 = %lld",
                         m.dir.c_str(), split.c_str(), static_cast<unsigned long long>(units),
                         static_cast<long long>(T) + 1));
  S = std::min<uint64_t>(static_cast<uint64_t>(c.shuffle_buffer), n);
  blocks_per_epoch = (n + S - 1) / S;
  own.ranks = world;
  if (bucketed && c.token_budget > 0) {
    own.token_budget = c.token_budget;
    own.pad_multiple = c.pad_multiple;
  } else {
    own.rows = B;
  }
  layout = own;
  fingerprint = {{"data_version", m.data_version}, {"split", split},  {"mode", c.mode},
                 {"seq_len", std::to_string(T)},  {"seed", std::to_string(seed)},
                 {"shuffle", c.shuffle ? "true" : "false"}, {"shuffle_buffer", std::to_string(S)}};
  if (bucketed) fingerprint.emplace_back("long_docs", c.long_docs);
  plan_shards = std::make_unique<ShardCache>(set);
}

// ---- planner -----------------------------------------------------------------------------------

std::shared_ptr<const EpochTable> Loader::Impl::epoch_table(int64_t e) {
  auto& slot = epochs[e];
  if (!slot) {
    auto t = std::make_shared<EpochTable>();
    for (uint32_t i = 0; i < set.shards.size(); ++i) t->order.push_back(i);
    if (cfg.shuffle) shuffle(t->order, rng_for({seed, static_cast<uint64_t>(e), kShardOrder}));
    t->start.push_back(0);
    for (uint32_t i : t->order) t->start.push_back(t->start.back() + set.shards[i]->units);
    slot = t;
  }
  return slot;
}

const std::vector<uint32_t>& Loader::Impl::block_perm(uint64_t g) {
  auto& v = perms[g];
  if (v.empty()) {
    v.resize(block_size(g));
    for (uint32_t i = 0; i < v.size(); ++i) v[i] = i;
    if (cfg.shuffle) shuffle(v, rng_for({seed, g / blocks_per_epoch, g % blocks_per_epoch, kBlockPerm}));
  }
  return v;
}

// Moves the walker past exhausted shards and documents without samples.
void Loader::Impl::normalize(const EpochTable& ep) {
  while (walker.p < ep.order.size()) {
    const ShardReader& s = plan_shards->get(ep.order[walker.p]);
    if (walker.doc == s.num_docs()) {
      ++walker.p, walker.doc = 0, walker.k = 0;
    } else if (walker.k == samples_of_doc(s.doc_length(walker.doc), split_docs, T)) {
      ++walker.doc, walker.k = 0;
    } else {
      return;
    }
  }
}

// Bucketed samples j0 .. j0+count-1 of epoch e, before any shuffle. Walks on from where the last
// call stopped; elsewhere it finds the shard from the epoch table and scans that shard's documents.
std::vector<Ref> Loader::Impl::unshuffled(int64_t e, uint64_t j0, uint64_t count) {
  auto ep = epoch_table(e);
  if (walker.epoch != e || walker.j != j0) {
    walker = {e, j0, 0, 0, 0};
    walker.p = static_cast<size_t>(std::upper_bound(ep->start.begin(), ep->start.end(), j0) - ep->start.begin() - 1);
    uint64_t r = j0 - ep->start[walker.p];
    const ShardReader& s = plan_shards->get(ep->order[walker.p]);
    for (uint64_t c; (c = samples_of_doc(s.doc_length(walker.doc), split_docs, T)) <= r; ++walker.doc) r -= c;
    walker.k = r;
  }
  std::vector<Ref> out;
  out.reserve(count);
  for (normalize(*ep); out.size() < count; normalize(*ep)) {
    const uint32_t shard = ep->order[walker.p];
    const uint64_t m = plan_shards->get(shard).doc_length(walker.doc) + 1;  // with its EOS
    const uint64_t off = walker.k * static_cast<uint64_t>(T);
    out.push_back({shard, static_cast<uint32_t>(std::min<uint64_t>(T + 1, m - off)), walker.doc, off});
    ++walker.k, ++walker.j;
  }
  return out;
}

// Token-budget batches of v[pos..]: W*k samples with k * padded(longest) <= budget, k as large as
// fits; the last batch takes the rest when fewer than W samples would be left over (loader.h).
std::vector<size_t> Loader::Impl::budget_cuts(const std::vector<Ref>& v, size_t pos, const BatchLayout& l) const {
  const size_t W = static_cast<size_t>(l.ranks);
  auto fits = [&](size_t k, uint32_t longest) { return static_cast<int64_t>(k) * padded(longest, l.pad_multiple, T) <= l.token_budget; };
  auto longest = [&](size_t a, size_t b) {
    uint32_t m = 0;
    for (size_t i = a; i < b; ++i) m = std::max(m, v[i].len);
    return m;
  };
  std::vector<size_t> cuts;
  while (pos < v.size()) {
    const size_t rem = v.size() - pos;
    size_t k = 0;
    for (uint32_t mx = 0; W * (k + 1) <= rem; ++k) {
      const uint32_t m2 = std::max(mx, longest(pos + W * k, pos + W * (k + 1)));
      if (k >= 1 && !fits(k + 1, m2)) break;
      mx = m2;
    }
    size_t take = k == 0 ? rem : W * k;
    if (k > 0 && rem - take > 0 && rem - take < W) {
      if (fits(k + 1, longest(pos, v.size()))) take = rem;
      else if (k >= 2) take -= W;
    }
    cuts.push_back(pos);
    pos += take;
  }
  return cuts;
}

// The bucketed block g in stream order: permuted, sorted longest first, cut into batches by the
// layout that applies to it, batch order shuffled.
const BlockTable& Loader::Impl::block(uint64_t g) {
  auto it = blocks.find(g);
  if (it != blocks.end()) return it->second;
  BlockTable t;
  t.start = block_start(g);
  const int64_t e = static_cast<int64_t>(g / blocks_per_epoch);
  const uint64_t b = g % blocks_per_epoch, size = block_size(g);
  std::vector<Ref> base = unshuffled(e, b * S, size);
  std::vector<Ref> v(size);
  const auto& perm = block_perm(g);
  for (size_t i = 0; i < size; ++i) v[i] = base[perm[i]];
  std::stable_sort(v.begin(), v.end(), [](const Ref& x, const Ref& y) { return x.len > y.len; });
  const BatchLayout& l = g == held_block ? held_layout : layout;
  auto rng = rng_for({seed, static_cast<uint64_t>(e), b, kBatchOrder});
  if (fixed_size(l)) {
    // Head: completes the batch begun in the previous block; tail: begins the next one.
    const uint64_t G = global_rows(l);
    const uint64_t h = std::min(size, (l.anchor % G + G - t.start % G) % G), tail = (size - h) % G;
    std::vector<uint64_t> chunks((size - h - tail) / G);
    for (uint64_t i = 0; i < chunks.size(); ++i) chunks[i] = h + tail + i * G;
    if (cfg.shuffle) shuffle(chunks, rng);
    t.order.assign(v.begin(), v.begin() + static_cast<ptrdiff_t>(h));
    for (uint64_t c : chunks) t.order.insert(t.order.end(), v.begin() + static_cast<ptrdiff_t>(c), v.begin() + static_cast<ptrdiff_t>(c + G));
    t.order.insert(t.order.end(), v.begin() + static_cast<ptrdiff_t>(h), v.begin() + static_cast<ptrdiff_t>(h + tail));
  } else {
    std::vector<size_t> cuts = budget_cuts(v, 0, l);
    std::vector<size_t> order(cuts.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (cfg.shuffle) shuffle(order, rng);
    for (size_t i : order) {
      t.cuts.push_back(t.order.size());
      const size_t end = i + 1 < cuts.size() ? cuts[i + 1] : v.size();
      t.order.insert(t.order.end(), v.begin() + static_cast<ptrdiff_t>(cuts[i]), v.begin() + static_cast<ptrdiff_t>(end));
    }
  }
  // A block entered under another layout keeps its order; the current layout cuts the rest.
  if (g == held_block && !fixed_size(layout) && !same_order(held_layout, layout))
    t.cuts = budget_cuts(t.order, held_pos - t.start, layout);
  return blocks.emplace(g, std::move(t)).first->second;
}

Loader::Impl::Plan Loader::Impl::plan() {
  Plan p;
  p.epoch = static_cast<int64_t>(cursor / n);
  const uint64_t W = static_cast<uint64_t>(world);
  if (!bucketed) {
    const uint64_t G = W * static_cast<uint64_t>(B), first = cursor + static_cast<uint64_t>(rank * B);
    for (uint64_t i = first; i < first + static_cast<uint64_t>(B); ++i) {
      const int64_t e = static_cast<int64_t>(i / n);
      const uint64_t g = block_of(i), in_block = i - block_start(g);
      auto ep = epoch_table(e);
      if (p.keep.empty() || p.keep.back() != ep) p.keep.push_back(ep);
      p.rows.push_back({ep.get(), (g % blocks_per_epoch * S + block_perm(g)[in_block]) * static_cast<uint64_t>(T), {}});
    }
    cursor += G;
  } else {
    std::vector<Ref> batch;
    if (fixed_size(layout)) {
      for (uint64_t i = cursor, end = cursor + W * static_cast<uint64_t>(B); i < end; ++i) {
        const BlockTable& t = block(block_of(i));
        batch.push_back(t.order[i - t.start]);
      }
    } else {
      const BlockTable& t = block(block_of(cursor));
      const size_t pos = cursor - t.start;
      auto c = std::lower_bound(t.cuts.begin(), t.cuts.end(), pos);
      if (c == t.cuts.end() || *c != pos)
        throw DataError(strf("loader state: cursor %llu is not at a batch boundary of its block",
                             static_cast<unsigned long long>(cursor)));
      const size_t end = c + 1 == t.cuts.end() ? t.order.size() : *(c + 1);
      batch.assign(t.order.begin() + static_cast<ptrdiff_t>(pos), t.order.begin() + static_cast<ptrdiff_t>(end));
    }
    cursor += batch.size();
    std::stable_sort(batch.begin(), batch.end(), [](const Ref& x, const Ref& y) { return x.len > y.len; });
    for (size_t i = static_cast<size_t>(rank); i < batch.size(); i += W) p.rows.push_back({nullptr, 0, batch[i]});
  }
  p.cursor_after = cursor;
  // Forget tables behind the cursor.
  const uint64_t g = block_of(cursor);
  perms.erase(perms.begin(), perms.lower_bound(g));
  blocks.erase(blocks.begin(), blocks.lower_bound(g));
  epochs.erase(epochs.begin(), epochs.lower_bound(static_cast<int64_t>(cursor / n)));
  return p;
}

// ---- building batches (outside the lock) -------------------------------------------------------

// The packed window of T+1 tokens at `pos` of an epoch's stream.
void Loader::Impl::window(const EpochTable& ep, uint64_t pos, uint32_t* w, SampleOrigin* origin, ShardCache& shards) const {
  size_t p = static_cast<size_t>(std::upper_bound(ep.start.begin(), ep.start.end(), pos) - ep.start.begin() - 1);
  const uint64_t q = pos - ep.start[p];
  const ShardReader* s = &shards.get(ep.order[p]);
  uint64_t lo = 0, hi = s->num_docs();  // stream start of document d is doc_offset(d) + d
  while (hi - lo > 1) {
    const uint64_t mid = (lo + hi) / 2;
    (s->doc_offset(mid) + mid <= q ? lo : hi) = mid;
  }
  uint64_t d = lo, o = q - (s->doc_offset(d) + d);
  *origin = {set.shards[ep.order[p]]->manifest_index, d, o};
  for (uint64_t k = 0, need = static_cast<uint64_t>(T) + 1; k < need;) {
    if (d == s->num_docs()) {
      s = &shards.get(ep.order[++p]);
      d = o = 0;
      continue;
    }
    const uint64_t len = s->doc_length(d);
    if (o < len) {
      const uint64_t c = std::min(len - o, need - k);
      s->read_tokens(s->doc_offset(d) + o, c, w + k);
      k += c, o += c;
    } else {
      w[k++] = eos;
      ++d, o = 0;
    }
  }
}

void Loader::Impl::sample(const Ref& r, uint32_t* w, ShardCache& shards) const {
  const ShardReader& s = shards.get(r.shard);
  const uint64_t c = std::min<uint64_t>(r.len, s.doc_length(r.doc) - r.offset);
  s.read_tokens(s.doc_offset(r.doc) + r.offset, c, w);
  if (c < r.len) w[c] = eos;
}

Batch Loader::Impl::build(const Plan& p, ShardCache& shards) const {
  Batch b;
  b.epoch = p.epoch;
  b.rows = static_cast<int64_t>(p.rows.size());
  std::vector<uint32_t> lens;
  for (const Row& r : p.rows) lens.push_back(bucketed ? r.ref.len : static_cast<uint32_t>(T + 1));
  if (b.rows > 0) b.cols = bucketed ? padded(*std::max_element(lens.begin(), lens.end()), cfg.pad_multiple, T) : T;
  const size_t cols = static_cast<size_t>(b.cols);
  b.inputs.reserve(p.rows.size() * cols);
  b.targets.reserve(p.rows.size() * cols);
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> h(XXH64_createState(), XXH64_freeState);
  XXH64_reset(h.get(), 0);
  std::vector<uint32_t> w(static_cast<size_t>(T) + 1);
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const Row& r = p.rows[i];
    const size_t len = lens[i];
    if (bucketed) {
      sample(r.ref, w.data(), shards);
      b.origins.push_back({set.shards[r.ref.shard]->manifest_index, r.ref.doc, r.ref.offset});
    } else {
      b.origins.emplace_back();
      window(*r.epoch, r.pos, w.data(), &b.origins.back(), shards);
    }
    XXH64_update(h.get(), w.data(), len * sizeof(uint32_t));
    b.inputs.insert(b.inputs.end(), w.begin(), w.begin() + static_cast<ptrdiff_t>(len - 1));
    b.targets.insert(b.targets.end(), w.begin() + 1, w.begin() + static_cast<ptrdiff_t>(len));
    b.inputs.resize(b.inputs.size() + cols - (len - 1), pad);
    b.targets.resize(b.targets.size() + cols - (len - 1), -1);
    b.target_tokens += static_cast<int64_t>(len - 1);
  }
  b.pad_tokens = b.rows * b.cols - b.target_tokens;
  b.hash = XXH64_digest(h.get());
  return b;
}

// ---- pipeline ----------------------------------------------------------------------------------

void Loader::Impl::work() {
  ShardCache shards(set);
  std::unique_lock<std::mutex> lk(mu);
  for (;;) {
    work_cv.wait(lk, [&] { return stopping || (!failed && planned < returned + static_cast<uint64_t>(cfg.prefetch)); });
    if (stopping) return;
    const uint64_t index = planned++;
    Slot& slot = slots[index];  // map nodes stay put until next() erases this one
    Plan p;
    std::exception_ptr error;
    try {
      p = plan();
      slot.cursor_after = p.cursor_after;
      lk.unlock();
      try {
        slot.batch = build(p, shards);
        slot.batch.index = index;
      } catch (...) {
        error = std::current_exception();
      }
      lk.lock();
    } catch (...) {
      error = std::current_exception();
    }
    slot.error = error;
    slot.ready = true;
    failed = failed || error;
    ready_cv.notify_all();
  }
}

void Loader::Impl::start() {
  for (int64_t i = 0; i < cfg.workers; ++i) workers.emplace_back([this] { work(); });
}

void Loader::Impl::stop() {
  {
    std::lock_guard<std::mutex> lk(mu);
    stopping = true;
  }
  work_cv.notify_all();
  for (auto& t : workers) t.join();
  workers.clear();
  stopping = false;
}

// ---- Loader ------------------------------------------------------------------------------------

Loader::Loader(const DataConfig& cfg, const Manifest& m, const std::string& split, int64_t seq_len,
               int64_t micro_batch, int rank, int world_size, uint64_t seed)
    : impl_(std::make_unique<Impl>(cfg, m, split, seq_len, micro_batch, rank, world_size, seed)) {
  impl_->start();
}

Loader::~Loader() { impl_->stop(); }

Batch Loader::next() {
  Impl& I = *impl_;
  std::unique_lock<std::mutex> lk(I.mu);
  const auto t0 = std::chrono::steady_clock::now();
  auto it = I.slots.end();
  I.ready_cv.wait(lk, [&] { return (it = I.slots.find(I.returned)) != I.slots.end() && it->second.ready; });
  I.last_wait_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (it->second.error) std::rethrow_exception(it->second.error);  // the slot stays: sticky
  Batch b = std::move(it->second.batch);
  I.cursor_returned = it->second.cursor_after;
  I.slots.erase(it);
  ++I.returned;
  lk.unlock();
  I.work_cv.notify_all();
  return b;
}

double Loader::last_wait_ms() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->last_wait_ms;
}

int64_t Loader::samples_per_epoch() const { return static_cast<int64_t>(impl_->n); }

LoaderState Loader::state() const {
  const Impl& I = *impl_;
  std::lock_guard<std::mutex> lk(I.mu);
  LoaderState s;
  s.version = kStateVersion;
  s.cursor = I.cursor_returned;
  s.batches = I.returned;
  s.fingerprint = I.fingerprint;
  s.layout = s.block_layout = I.layout;
  if (I.held_block != kNone && I.block_of(s.cursor) == I.held_block && s.cursor > I.block_start(I.held_block))
    s.block_layout = I.held_layout;
  return s;
}

void Loader::load_state(const LoaderState& s) {
  Impl& I = *impl_;
  if (s.version != kStateVersion)
    throw DataError(strf("loader state: version %d, expected %d", s.version, kStateVersion));
  for (const auto& [key, value] : I.fingerprint) {
    auto it = std::find_if(s.fingerprint.begin(), s.fingerprint.end(), [&](const auto& kv) { return kv.first == key; });
    const std::string theirs = it == s.fingerprint.end() ? "(missing)" : it->second;
    if (theirs != value)
      throw DataError("loader state: field '" + key + "' differs: the state has " + theirs + ", this run " + value);
  }
  I.stop();
  std::lock_guard<std::mutex> lk(I.mu);
  I.slots.clear();
  I.planned = I.returned = s.batches;
  I.cursor = I.cursor_returned = s.cursor;
  I.failed = false;
  I.epochs.clear(), I.perms.clear(), I.blocks.clear(), I.plan_shards->clear();
  I.walker = {};
  I.layout = I.own;
  if (same_cuts(s.layout, I.own)) I.layout.anchor = s.layout.anchor;
  else I.layout.anchor = s.cursor;  // a new batch grid starts here
  const uint64_t g = I.block_of(s.cursor);
  I.held_block = kNone;
  if (I.bucketed && s.cursor > I.block_start(g) && !same_order(s.block_layout, I.layout)) {
    I.held_block = g;
    I.held_layout = s.block_layout;
    I.held_pos = s.cursor;
  }
  I.start();
}

// ---- LoaderState JSON --------------------------------------------------------------------------

std::string LoaderState::to_json() const {
  json j;
  j["version"] = version;
  j["cursor"] = cursor;
  j["batches"] = batches;
  j["fingerprint"] = json::object();
  for (const auto& [k, v] : fingerprint) j["fingerprint"][k] = v;
  j["layout"] = layout_json(layout);
  j["block_layout"] = layout_json(block_layout);
  return j.dump();
}

LoaderState LoaderState::from_json(const std::string& text) {
  try {
    const json j = json::parse(text);
    LoaderState s;
    s.version = j.at("version").get<int>();
    if (s.version != kStateVersion)
      throw DataError(strf("loader state: version %d, expected %d", s.version, kStateVersion));
    s.cursor = j.at("cursor").get<uint64_t>();
    s.batches = j.at("batches").get<uint64_t>();
    for (const auto& [k, v] : j.at("fingerprint").items()) s.fingerprint.emplace_back(k, v.get<std::string>());
    auto layout = [&](const char* key) {
      const json& l = j.at(key);
      return BatchLayout{l.at("ranks").get<int64_t>(), l.at("rows").get<int64_t>(), l.at("token_budget").get<int64_t>(),
                         l.at("pad_multiple").get<int64_t>(), l.at("anchor").get<uint64_t>()};
    };
    s.layout = layout("layout");
    s.block_layout = layout("block_layout");
    return s;
  } catch (const json::exception& e) {
    throw DataError(std::string("loader state: malformed (") + e.what() + ")");
  }
}

}  // namespace lm::data
