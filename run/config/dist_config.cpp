// The dist: section's keys (see dist_config.h): each one's type, allowed values and its one
// description, printed by `trainer --keys` and docs/config.md.
#include "run/config/dist_config.h"

#include "common/config/schema.h"

namespace lm {

void describe_dist(config_schema::Schema& s, DistConfig& d) {
  s.choice("dist.backend", &d.backend, "process group backend; auto = nccl on CUDA, gloo on CPU, at world size > 1; "
           "a named one also at world size 1", {"auto", "nccl", "gloo"});
  s.number("dist.timeout_s", &d.timeout_s, "seconds after which the rendezvous or any collective fails", 0, true);
  s.number("dist.bucket_mb", &d.bucket_mb, "gradient all-reduce bucket size in MB (10^6 bytes)", 0, true);
  s.integer("dist.zero", &d.zero, "1 = ZeRO-1: each rank keeps the optimizer's state of its piece of every gradient "
            "bucket only (1/world_size of it; whole parameters balanced by size for an optimizer that needs them), gradients reduce-scattered (NCCL) or all-reduced (Gloo), each rank "
            "steps its pieces, the weights all-gathered; checkpoints hold one optimizer shard per rank and resume at "
            "any world size and dist.zero; 2 = ZeRO-2: as 1, and each rank also keeps the summed gradients of its "
            "pieces only (1/world_size of them; each bucket's full sums freed once reduced; with train.grad_accum > 1 "
            "the micro-batches before the last still sum every gradient locally); 3 = ZeRO-3: as 2, and each rank "
            "also keeps only its pieces of the weights between steps, each block's (and the embeddings', final norm's "
            "and head's) gathered into a storage of its own before its forward and backward and released after; 0 = every rank keeps them all (no "
            "effect at world size 1)", 0, 3);
  s.boolean("dist.invariant", &d.invariant, "the same bits on any number of ranks: the global batch is world size x "
            "train.grad_accum micro-batches (kept when a resume changes the world size: set train.grad_accum to match); "
            "rank r holds the contiguous block r*grad_accum.. of them, their gradients added in one fixed binary tree over "
            "the global micro-batch indices (each rank's block a subtree, then the ranks' sums combined in the same tree: "
            "recursive doubling at a power-of-two world size > 2, else all-gathered), dropout seeded per global micro-batch; no overlap of communication with the backward; "
            "data packed, or bucketed with micro-batches of train.micro_batch_size rows (no data.token_budget), one "
            "stream or a mixture (its stages decided at each step's start); "
            "grad_accum a power of two at world size > 1; with any dist.zero, the same bits (ZeRO-2 and 3 keep each "
            "bucket's tree of the micro-batches' sums during a step and their pieces of the sums after it)");
}

}  // namespace lm
