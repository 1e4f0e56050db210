// The loader's planner: the sample stream, its shuffles and the bucketed batch cut (see plan.h; the
// rules are in loader.h). Everything here is cheap bookkeeping on indices; the only reads are
// document lengths (bucketed), through the planner's own shard cache.
#include "data/loader/plan.h"

#include <algorithm>
#include <random>

#include "common/checksum.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm::data {
namespace {

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

uint64_t samples_of_doc(uint64_t len, bool split, int64_t seq_len) {
  if (len == 0) return 0;
  return split ? (len + seq_len - 1) / seq_len : 1;
}

bool longer(const Ref& x, const Ref& y) { return x.len > y.len; }

}  // namespace

uint64_t stream_units(const ShardReader& s, bool bucketed, bool split_docs, int64_t seq_len) {
  if (!bucketed) return s.num_tokens() + s.num_docs();
  uint64_t units = 0;
  for (uint64_t d = 0; d < s.num_docs(); ++d) units += samples_of_doc(s.doc_length(d), split_docs, seq_len);
  return units;
}

int64_t padded(int64_t len, int64_t multiple, int64_t seq_len) {
  return std::min((len - 1 + multiple - 1) / multiple * multiple, seq_len);
}

Planner::Planner(const DataConfig& c, const ShardSet& set, int64_t seq_len, int64_t micro_batch, int rank, int world,
                 uint64_t seed, int64_t step_block)
    : set_(set), bucketed_(c.bucketed()), split_docs_(c.split_long_docs()), shuffle_(c.shuffle),
      T_(seq_len), B_(micro_batch), rank_(rank), world_(world), seed_(seed), step_block_(step_block), shards_(set) {
  uint64_t units = 0;
  for (size_t i = 0; i < set.size(); ++i) units += set.units(i);
  n_ = bucketed_ ? units : (units > 0 ? (units - 1) / static_cast<uint64_t>(T_) : 0);
  if (n_ == 0 && bucketed_)
    throw DataError(set.dir() + ": split '" + set.split() + "' has no sample (every document is empty)");
  if (n_ == 0)
    throw DataError(strf("%s: split '%s' is too short: %llu tokens (EOS included), fewer than seq_len+1 = %lld",
                         set.dir().c_str(), set.split().c_str(), static_cast<unsigned long long>(units),
                         static_cast<long long>(T_) + 1));
  S_ = std::min<uint64_t>(static_cast<uint64_t>(c.shuffle_buffer), n_);
  blocks_per_epoch_ = (n_ + S_ - 1) / S_;
  // Step blocks cut bucketed micro-batches whole (one rank's B rows), the same at any world size.
  own_.ranks = step_block_ > 0 ? 1 : world;
  if (bucketed_ && c.token_budget > 0) {
    own_.token_budget = c.token_budget;
    own_.pad_multiple = c.pad_multiple;
  } else {
    own_.rows = B_;
  }
  layout_ = own_;
}

// ---- resume ------------------------------------------------------------------------------------

void Planner::save(LoaderState& s) const {
  s.layout = s.block_layout = layout_;
  if (held_block_ != kNone && block_of(s.cursor) == held_block_ && s.cursor > block_start(held_block_))
    s.block_layout = held_layout_;
}

void Planner::restart(const LoaderState& s, bool) {
  cursor_ = step_anchor_ = s.cursor;
  epochs_.clear(), perms_.clear(), blocks_.clear(), permuted_.clear(), shards_.clear();
  walker_ = {};
  layout_ = own_;
  if (same_cuts(s.layout, own_)) layout_.anchor = s.layout.anchor;
  else layout_.anchor = s.cursor;  // a new batch grid starts here
  const uint64_t g = block_of(s.cursor);
  held_block_ = kNone;
  if (bucketed_ && s.cursor > block_start(g) && !same_order(s.block_layout, layout_)) {
    held_block_ = g;
    held_layout_ = s.block_layout;
    held_pos_ = s.cursor;
  }
}

// ---- the sample stream -------------------------------------------------------------------------

std::shared_ptr<const EpochTable> Planner::epoch_table(int64_t e) {
  auto& slot = epochs_[e];
  if (!slot) {
    auto t = std::make_shared<EpochTable>();
    for (uint32_t i = 0; i < set_.size(); ++i) t->order.push_back(i);
    if (shuffle_) shuffle(t->order, rng_for({seed_, static_cast<uint64_t>(e), kShardOrder}));
    t->start.push_back(0);
    for (uint32_t i : t->order) t->start.push_back(t->start.back() + set_.units(i));
    slot = t;
  }
  return slot;
}

const std::vector<uint32_t>& Planner::block_perm(uint64_t g) {
  auto& v = perms_[g];
  if (v.empty()) {
    v.resize(block_size(g));
    for (uint32_t i = 0; i < v.size(); ++i) v[i] = i;
    if (shuffle_) shuffle(v, rng_for({seed_, g / blocks_per_epoch_, g % blocks_per_epoch_, kBlockPerm}));
  }
  return v;
}

// Moves the walker past exhausted shards and documents without samples.
void Planner::normalize(const EpochTable& ep) {
  while (walker_.p < ep.order.size()) {
    const ShardReader& s = shards_.get(ep.order[walker_.p]);
    if (walker_.doc == s.num_docs()) {
      ++walker_.p, walker_.doc = 0, walker_.k = 0;
    } else if (walker_.k == samples_of_doc(s.doc_length(walker_.doc), split_docs_, T_)) {
      ++walker_.doc, walker_.k = 0;
    } else {
      return;
    }
  }
}

// Bucketed samples j0 .. j0+count-1 of epoch e, before any shuffle. Walks on from where the last
// call stopped; elsewhere it finds the shard from the epoch table and scans that shard's documents.
std::vector<Ref> Planner::unshuffled(int64_t e, uint64_t j0, uint64_t count) {
  auto ep = epoch_table(e);
  if (walker_.epoch != e || walker_.j != j0) {
    walker_ = {e, j0, 0, 0, 0};
    walker_.p = static_cast<size_t>(std::upper_bound(ep->start.begin(), ep->start.end(), j0) - ep->start.begin() - 1);
    uint64_t r = j0 - ep->start[walker_.p];
    const ShardReader& s = shards_.get(ep->order[walker_.p]);
    for (uint64_t c; (c = samples_of_doc(s.doc_length(walker_.doc), split_docs_, T_)) <= r; ++walker_.doc) r -= c;
    walker_.k = r;
  }
  std::vector<Ref> out;
  out.reserve(count);
  for (normalize(*ep); out.size() < count; normalize(*ep)) {
    const uint32_t shard = ep->order[walker_.p];
    const uint64_t m = shards_.get(shard).doc_length(walker_.doc) + 1;  // with its EOS
    const uint64_t off = walker_.k * static_cast<uint64_t>(T_);
    out.push_back({shard, static_cast<uint32_t>(std::min<uint64_t>(T_ + 1, m - off)), walker_.doc, off});
    ++walker_.k, ++walker_.j;
  }
  return out;
}

// ---- the bucketed batch cut --------------------------------------------------------------------

// Token-budget batches of v[pos..]: W*k samples with k * padded(longest) <= budget, k as large as
// fits; the last batch takes the rest when fewer than W samples would be left over (loader.h).
std::vector<size_t> Planner::budget_cuts(const std::vector<Ref>& v, size_t pos, const BatchLayout& l) const {
  const size_t W = static_cast<size_t>(l.ranks);
  auto fits = [&](size_t k, uint32_t longest) { return static_cast<int64_t>(k) * padded(longest, l.pad_multiple, T_) <= l.token_budget; };
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

// Puts block g's samples v (sorted longest first) into t.order as batches cut by layout l, in an
// order shuffled from (seed, epoch, block).
void Planner::order_block(BlockTable& t, const std::vector<Ref>& v, const BatchLayout& l, uint64_t g) const {
  const uint64_t size = v.size();
  auto rng = rng_for({seed_, g / blocks_per_epoch_, g % blocks_per_epoch_, kBatchOrder});
  auto at = [&](uint64_t i) { return v.begin() + static_cast<ptrdiff_t>(i); };
  if (fixed_size(l)) {
    // Head: completes the batch begun in the previous block; tail: begins the next one.
    const uint64_t G = global_rows(l);
    const uint64_t h = std::min(size, (l.anchor % G + G - t.start % G) % G), tail = (size - h) % G;
    std::vector<uint64_t> chunks((size - h - tail) / G);
    for (uint64_t i = 0; i < chunks.size(); ++i) chunks[i] = h + tail + i * G;
    if (shuffle_) shuffle(chunks, rng);
    t.order.assign(at(0), at(h));
    for (uint64_t c : chunks) t.order.insert(t.order.end(), at(c), at(c + G));
    t.order.insert(t.order.end(), at(h), at(h + tail));
  } else {
    std::vector<size_t> cuts = budget_cuts(v, 0, l);
    std::vector<size_t> order(cuts.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    if (shuffle_) shuffle(order, rng);
    for (size_t i : order) {
      t.cuts.push_back(t.order.size());
      const size_t end = i + 1 < cuts.size() ? cuts[i + 1] : v.size();
      t.order.insert(t.order.end(), at(cuts[i]), at(end));
    }
  }
}

// The bucketed block g in stream order: permuted, sorted longest first, cut into batches by the
// layout that applies to it, batch order shuffled.
const Planner::BlockTable& Planner::block(uint64_t g) {
  auto it = blocks_.find(g);
  if (it != blocks_.end()) return it->second;
  BlockTable t;
  t.start = block_start(g);
  const uint64_t size = block_size(g);
  std::vector<Ref> base = unshuffled(static_cast<int64_t>(g / blocks_per_epoch_), g % blocks_per_epoch_ * S_, size);
  std::vector<Ref> v(size);
  const auto& perm = block_perm(g);
  for (size_t i = 0; i < size; ++i) v[i] = base[perm[i]];
  std::stable_sort(v.begin(), v.end(), longer);
  order_block(t, v, g == held_block_ ? held_layout_ : layout_, g);
  // A block entered under another layout keeps its order; the current layout cuts the rest.
  if (g == held_block_ && !fixed_size(layout_) && !same_order(held_layout_, layout_))
    t.cuts = budget_cuts(t.order, held_pos_ - t.start, layout_);
  return blocks_.emplace(g, std::move(t)).first->second;
}

// ---- batches -----------------------------------------------------------------------------------

Plan::Row Planner::sample(uint64_t i, Plan& p, int64_t* tokens) {
  const uint64_t g = block_of(i), in_block = i - block_start(g);
  if (bucketed_) {
    auto& v = permuted_[g];
    if (v.empty()) {
      const std::vector<Ref> base = unshuffled(static_cast<int64_t>(g / blocks_per_epoch_), g % blocks_per_epoch_ * S_, block_size(g));
      const auto& perm = block_perm(g);
      v.resize(base.size());
      for (size_t k = 0; k < v.size(); ++k) v[k] = base[perm[k]];
    }
    *tokens = static_cast<int64_t>(v[in_block].len) - 1;
    return {nullptr, 0, v[in_block], 0};
  }
  auto ep = epoch_table(static_cast<int64_t>(i / n_));
  if (p.keep.empty() || p.keep.back() != ep) p.keep.push_back(ep);
  *tokens = T_;
  return {ep.get(), (g % blocks_per_epoch_ * S_ + block_perm(g)[in_block]) * static_cast<uint64_t>(T_), {}, 0};
}

void Planner::forget_before(uint64_t i) {
  const uint64_t g = block_of(i);
  perms_.erase(perms_.begin(), perms_.lower_bound(g));
  permuted_.erase(permuted_.begin(), permuted_.lower_bound(g));
  epochs_.erase(epochs_.begin(), epochs_.lower_bound(static_cast<int64_t>(i / n_)));
}

uint64_t Planner::in_step() const {
  const uint64_t WB = static_cast<uint64_t>(world_ * B_), A = static_cast<uint64_t>(step_block_);
  return (cursor_ - step_anchor_) / WB % A;
}

uint64_t Planner::step_start() const {
  return step_block_ > 0 ? cursor_ - in_step() * static_cast<uint64_t>(world_ * B_) : cursor_;
}

uint64_t Planner::micro_first(int rank) const {
  const auto k = static_cast<int64_t>(in_step());
  return step_start() + static_cast<uint64_t>(step_block(rank, step_block_).at(k) * B_);
}

void Planner::next_packed(Plan& p) {
  uint64_t first = cursor_ + static_cast<uint64_t>(rank_ * B_);
  if (step_block_ > 0) first = micro_first(rank_);  // contiguous blocks: batch k of the step is global micro-batch rank*A + k
  int64_t tokens = 0;
  for (uint64_t i = first; i < first + static_cast<uint64_t>(B_); ++i) p.rows.push_back(sample(i, p, &tokens));
  cursor_ += static_cast<uint64_t>(world_) * static_cast<uint64_t>(B_);
  p.source_tokens = {world_ * B_ * T_};
}

void Planner::next_bucketed(Plan& p) {
  const uint64_t W = static_cast<uint64_t>(world_);
  std::vector<Ref> batch;
  if (step_block_ > 0) {  // step blocks: this rank's whole micro-batch rank*A + k of the step (fixed size only)
    auto rows = [&](uint64_t first) {
      std::vector<Ref> v;
      for (uint64_t i = first; i < first + static_cast<uint64_t>(B_); ++i) {
        const BlockTable& t = block(block_of(i));
        v.push_back(t.order[i - t.start]);
      }
      return v;
    };
    int64_t tokens = 0;  // of the W micro-batches the ranks take at this call: the global batch
    for (int r = 0; r < world_; ++r) {
      std::vector<Ref> v = rows(micro_first(r));
      for (const Ref& x : v) tokens += static_cast<int64_t>(x.len) - 1;
      if (r == rank_) batch = std::move(v);
    }
    cursor_ += W * static_cast<uint64_t>(B_);
    p.source_tokens = {tokens};
    std::stable_sort(batch.begin(), batch.end(), longer);
    for (const Ref& x : batch) p.rows.push_back({nullptr, 0, x, 0});
    return;
  }
  if (fixed_size(layout_)) {
    for (uint64_t i = cursor_, end = cursor_ + W * static_cast<uint64_t>(B_); i < end; ++i) {
      const BlockTable& t = block(block_of(i));
      batch.push_back(t.order[i - t.start]);
    }
  } else {
    const BlockTable& t = block(block_of(cursor_));
    const size_t pos = cursor_ - t.start;
    auto c = std::lower_bound(t.cuts.begin(), t.cuts.end(), pos);
    if (c == t.cuts.end() || *c != pos)
      throw DataError(strf("loader state: cursor %llu is not at a batch boundary of its block",
                           static_cast<unsigned long long>(cursor_)));
    const size_t end = c + 1 == t.cuts.end() ? t.order.size() : *(c + 1);
    batch.assign(t.order.begin() + static_cast<ptrdiff_t>(pos), t.order.begin() + static_cast<ptrdiff_t>(end));
  }
  cursor_ += batch.size();
  int64_t tokens = 0;
  for (const Ref& r : batch) tokens += static_cast<int64_t>(r.len) - 1;
  p.source_tokens = {tokens};
  std::stable_sort(batch.begin(), batch.end(), longer);
  for (size_t i = static_cast<size_t>(rank_); i < batch.size(); i += W) p.rows.push_back({nullptr, 0, batch[i], 0});
}

// Remote and raw-text datasets: the shards from the one holding the start of the cursor's shuffle
// block on, in the order the stream reads them (into the next epochs), k at most and none twice.
std::vector<uint32_t> Planner::upcoming(uint64_t cursor, size_t k) {
  const uint64_t g = block_of(cursor);
  int64_t e = static_cast<int64_t>(g / blocks_per_epoch_);
  const uint64_t u = g % blocks_per_epoch_ * S_ * (bucketed_ ? 1 : static_cast<uint64_t>(T_));
  auto ep = epoch_table(e);
  size_t p = static_cast<size_t>(std::upper_bound(ep->start.begin(), ep->start.end(), u) - ep->start.begin() - 1);
  std::vector<uint32_t> out;
  while (out.size() < k && std::find(out.begin(), out.end(), ep->order[p]) == out.end()) {
    out.push_back(ep->order[p]);
    if (++p == ep->order.size()) ep = epoch_table(++e), p = 0;
  }
  return out;
}

Plan Planner::next() {
  Plan p;
  p.epoch = static_cast<int64_t>(cursor_ / n_);
  if (bucketed_) next_bucketed(p);
  else next_packed(p);
  p.cursor_after = cursor_;
  // Forget the tables behind the cursor (step blocks: behind the step, which later calls read from).
  const uint64_t from = step_start(), g = block_of(from);
  perms_.erase(perms_.begin(), perms_.lower_bound(g));
  blocks_.erase(blocks_.begin(), blocks_.lower_bound(g));
  epochs_.erase(epochs_.begin(), epochs_.lower_bound(static_cast<int64_t>(from / n_)));
  read_ahead_from(cursor_);
  return p;
}

void Planner::read_ahead_from(uint64_t i) {
  if (set_.remote()) set_.read_ahead(upcoming(i, set_.ahead_count()));  // the fetch order
}

}  // namespace lm::data
