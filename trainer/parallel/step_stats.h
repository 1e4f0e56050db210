// What every rank reports after a step, gathered so that rank 0 logs global values and all ranks
// take the same save/stop decisions; and the step's global target-token count (the loss divisor).
#pragma once

#include <cstdint>
#include <vector>

namespace lm {

class Comm;

struct RankStats {
  double loss_sum = 0;      // sum of per-token losses of this rank's micro-batches
  double z_loss_sum = 0;    // sum of per-token z-loss terms (optim.z_loss; 0 without)
  int64_t targets = 0, pad = 0, inputs = 0;
  double wait_ms = 0;       // time this rank waited for data
  bool stop = false;        // a stop signal arrived here
  bool save = false;        // rank 0: a checkpoint is due
  uint64_t hash = 0;        // this rank's batch hash
  double flops = 0;         // matmul FLOPs of this rank's non-pad tokens (local: not gathered)
};

struct GlobalStats {
  double loss = 0;          // loss_sum over all ranks / targets (the step's mean loss)
  double z_loss = 0;        // z_loss_sum likewise
  int64_t targets = 0, pad = 0, inputs = 0;
  double wait_max_ms = 0;   // the slowest rank's wait
  bool stop = false;        // any rank
  bool save = false;        // rank 0's decision
  uint64_t batch_hash = 0;  // the rank hashes combined (rank 0's alone in a single process)
};

// All-gathers every rank's stats (comm may be null: a single process).
GlobalStats gather_step_stats(const RankStats& mine, Comm* comm, int world, int64_t step);

// Target tokens of the whole step over all ranks. Packed batches all hold micro_batch * seq_len
// targets, so no collective is needed; bucketed ones vary and are summed.
double global_target_tokens(int64_t local, bool packed, Comm* comm, int world);

}  // namespace lm
