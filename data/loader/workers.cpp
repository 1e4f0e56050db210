// The loader's worker threads, prefetch queue and batch reading (see workers.h).
#include "data/loader/workers.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <tuple>

#include "data/loader/token_walk.h"
#include "common/errors.h"
#include "common/log.h"

namespace lm::data {

Workers::Workers(const DataConfig& c, std::vector<const ShardSet*> sets, BatchPlanner& planner, int64_t seq_len,
                 uint32_t eos, uint32_t pad, uint32_t vocab)
    : sets_(std::move(sets)), planner_(planner), bucketed_(c.bucketed()), T_(seq_len), threads_(c.workers),
      prefetch_(c.prefetch), pad_multiple_(c.pad_multiple), eos_(eos), pad_(pad), vocab_(vocab) {}

Workers::~Workers() { stop(); }

// ---- the queue ---------------------------------------------------------------------------------

void Workers::start(uint64_t batches, uint64_t cursor, MixSnapshot mix) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    slots_.clear();
    history_.clear();
    planned_ = returned_ = batches;
    cursor_returned_ = cursor;
    mix_returned_ = std::move(mix);
    failed_ = false;
  }
  for (int64_t i = 0; i < threads_; ++i) pool_.emplace_back([this] { work(); });
}

void Workers::stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : pool_) t.join();
  pool_.clear();
  stopping_ = false;
}

void Workers::work() {
  std::vector<ShardCache> shards;
  for (const ShardSet* s : sets_) shards.emplace_back(*s);
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    work_cv_.wait(lk, [&] { return stopping_ || (!failed_ && planned_ < returned_ + static_cast<uint64_t>(prefetch_)); });
    if (stopping_) return;
    const uint64_t index = planned_++;
    Slot& slot = slots_[index];  // map nodes stay put until next() erases this one
    Plan p;
    std::exception_ptr error;
    try {
      p = planner_.next();
      slot.cursor_after = p.cursor_after;
      slot.mix_after = std::move(p.mix_after);
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
    failed_ = failed_ || error;
    ready_cv_.notify_all();
  }
}

Batch Workers::next() {
  std::unique_lock<std::mutex> lk(mu_);
  const auto t0 = std::chrono::steady_clock::now();
  auto it = slots_.end();
  ready_cv_.wait(lk, [&] { return (it = slots_.find(returned_)) != slots_.end() && it->second.ready; });
  last_wait_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (it->second.error) std::rethrow_exception(it->second.error);  // the slot stays: sticky
  Batch b = std::move(it->second.batch);
  history_.push_back({returned_, cursor_returned_, mix_returned_});
  if (history_.size() > 1024) history_.pop_front();
  cursor_returned_ = it->second.cursor_after;
  mix_returned_ = std::move(it->second.mix_after);
  slots_.erase(it);
  ++returned_;
  lk.unlock();
  work_cv_.notify_all();
  return b;
}

double Workers::last_wait_ms() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_wait_ms_;
}

Workers::Returned Workers::returned() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {returned_, cursor_returned_, mix_returned_};
}

void Workers::rewind_to(uint64_t batches) {
  std::lock_guard<std::mutex> lk(mu_);
  for (; returned_ > batches && !history_.empty(); history_.pop_back()) {
    returned_ = history_.back().batches;
    cursor_returned_ = history_.back().cursor;
    mix_returned_ = history_.back().mix;
  }
  if (returned_ != batches) throw Error(strf("loader: cannot rewind to batch %llu", static_cast<unsigned long long>(batches)));
}

// ---- reading a planned batch (outside the lock) ------------------------------------------------

// Copies row r's tokens into w: packed, the window of T+1 tokens at r.pos of its epoch's stream;
// bucketed, the sample (at most T+1 tokens). Returns where the row starts.
SampleOrigin Workers::read_row(const Plan::Row& r, uint32_t* w, ShardCache& shards) const {
  const ShardSet& set = *sets_[r.source];
  if (bucketed_) {
    TokenWalk walk(set.size(), eos_, vocab_, [&](size_t i) -> const ShardReader& { return shards.get(static_cast<uint32_t>(i)); });
    walk.seek(r.ref.shard, r.ref.doc, r.ref.offset);
    walk.read(w, r.ref.len);
    return {set.manifest_index(r.ref.shard), r.ref.doc, r.ref.offset, r.source};
  }
  const EpochTable& ep = *r.epoch;
  TokenWalk walk(ep.order.size(), eos_, vocab_, [&](size_t i) -> const ShardReader& { return shards.get(ep.order[i]); });
  const size_t p = static_cast<size_t>(std::upper_bound(ep.start.begin(), ep.start.end(), r.pos) - ep.start.begin() - 1);
  walk.seek(p, r.pos - ep.start[p]);
  const SampleOrigin origin{set.manifest_index(ep.order[p]), walk.doc(), walk.offset(), r.source};
  // Never short: an epoch's N = floor((L-1)/T) windows all end inside its stream of L tokens.
  if (walk.read(w, static_cast<uint64_t>(T_) + 1) != static_cast<uint64_t>(T_) + 1)
    throw Error("loader: a window runs past the end of its epoch");
  return origin;
}

Batch Workers::build(const Plan& p, std::vector<ShardCache>& shards) const {
  Batch b;
  b.epoch = p.epoch;
  b.source_tokens = p.source_tokens;
  b.rows = static_cast<int64_t>(p.rows.size());
  std::vector<uint32_t> lens;
  for (const Plan::Row& r : p.rows) lens.push_back(bucketed_ ? r.ref.len : static_cast<uint32_t>(T_ + 1));
  if (b.rows > 0) b.cols = bucketed_ ? padded(*std::max_element(lens.begin(), lens.end()), pad_multiple_, T_) : T_;
  const size_t cols = static_cast<size_t>(b.cols);
  b.inputs.reserve(p.rows.size() * cols);
  b.targets.reserve(p.rows.size() * cols);
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> h(XXH64_createState(), XXH64_freeState);
  XXH64_reset(h.get(), 0);
  std::vector<uint32_t> w(static_cast<size_t>(T_) + 1);
  for (size_t i = 0; i < p.rows.size(); ++i) {
    const size_t len = lens[i];
    b.origins.push_back(read_row(p.rows[i], w.data(), shards[p.rows[i].source]));
    XXH64_update(h.get(), w.data(), len * sizeof(uint32_t));
    b.inputs.insert(b.inputs.end(), w.begin(), w.begin() + static_cast<ptrdiff_t>(len - 1));
    b.targets.insert(b.targets.end(), w.begin() + 1, w.begin() + static_cast<ptrdiff_t>(len));
    b.inputs.resize(b.inputs.size() + cols - (len - 1), pad_);
    b.targets.resize(b.targets.size() + cols - (len - 1), -1);
    b.target_tokens += static_cast<int64_t>(len - 1);
  }
  b.pad_tokens = b.rows * b.cols - b.target_tokens;
  b.hash = XXH64_digest(h.get());
  return b;
}

}  // namespace lm::data
