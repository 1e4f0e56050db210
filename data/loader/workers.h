// The loader's workers (internal to data/loader): the threads that build batches ahead of the
// consumer, the prefetch queue, and the reading of a planned batch's tokens.
//
// `workers` threads share the Planner under one lock. A worker takes the next batch number while
// fewer than `prefetch` batches are planned but not yet returned, asks the planner for that batch's
// rows (cheap: indices and shard offsets), then reads the tokens outside the lock through its own
// ShardCache and TokenWalk. next() hands batches out strictly by number. A worker's exception is
// stored in its batch's slot and rethrown by next() when that batch is due.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "data/loader/data_config.h"
#include "data/loader/loader.h"
#include "data/loader/plan.h"
#include "data/loader/shards.h"

namespace lm::data {

class Workers {
 public:
  // Starts no thread (start() does). eos and pad are the tokenizer's ids; every token id read must
  // be below vocab (else the batch's slot holds a DataError naming shard and document).
  // sets: the sources' shards (one for a single source), indexed by Plan::Row::source.
  Workers(const DataConfig& c, std::vector<const ShardSet*> sets, BatchPlanner& planner, int64_t seq_len, uint32_t eos,
          uint32_t pad, uint32_t vocab);
  ~Workers();  // stop()
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  // Starts the threads with an empty queue: the next batch is number `batches`, which begins at
  // stream sample `cursor` (and `mix`, the planner's mix_state()). REQUIRES: stopped; the planner
  // is at `cursor`.
  void start(uint64_t batches, uint64_t cursor, MixSnapshot mix);
  // Stops and joins the threads, also while they wait on a full queue.
  void stop();

  // Blocks for the next batch. An error met by a worker is rethrown here, in batch order, as the
  // exception the worker caught; it is sticky. One consumer thread.
  Batch next();
  double last_wait_ms() const;
  // Batches returned so far, the stream cursor and the mixture state after the last of them.
  struct Returned {
    uint64_t batches = 0, cursor = 0;
    MixSnapshot mix;
  };
  Returned returned() const;
  // returned() goes back to when `batches` had been returned (one of the last 1024); for a state
  // taken after a failed next() (Loader::rewind_to). Throws lm::Error when that is too far back.
  void rewind_to(uint64_t batches);

 private:
  struct Slot {
    bool ready = false;
    uint64_t cursor_after = 0;
    MixSnapshot mix_after;
    Batch batch;
    std::exception_ptr error;
  };
  void work();
  Batch build(const Plan& p, std::vector<ShardCache>& shards) const;
  SampleOrigin read_row(const Plan::Row& r, uint32_t* w, ShardCache& shards) const;

  // ---- fixed
  std::vector<const ShardSet*> sets_;
  BatchPlanner& planner_;  // guarded by mu_
  bool bucketed_;
  int64_t T_, threads_, prefetch_, pad_multiple_;
  uint32_t eos_, pad_, vocab_;

  // ---- the queue, guarded by mu_
  mutable std::mutex mu_;
  std::condition_variable work_cv_, ready_cv_;
  std::map<uint64_t, Slot> slots_;  // by batch number
  uint64_t planned_ = 0, returned_ = 0, cursor_returned_ = 0;
  MixSnapshot mix_returned_;
  std::deque<Returned> history_;  // returned() before each of the last batches
  bool stopping_ = false, failed_ = false;
  std::vector<std::thread> pool_;
  double last_wait_ms_ = 0;
};

}  // namespace lm::data
