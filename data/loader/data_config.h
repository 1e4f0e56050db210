// Configuration of the training data (YAML section `data:`). Torch-free.
#pragma once

#include <cstdint>
#include <string>

namespace lm {

struct DataConfig {
  std::string train;  // directory written by `prep` (its manifest.json); required
  std::string val;    // directory for validation; empty = the `val` split of `train`

  // The streaming loader (data/loader/loader.h).
  std::string mode = "packed";       // packed: EOS-joined windows of seq_len+1 | bucketed: one document per sample
  int64_t workers = 2;               // threads building batches (>= 1)
  int64_t prefetch = 4;              // batches built ahead of the consumer (queue depth, >= 1)
  bool shuffle = true;               // shuffle shard order and samples (else the manifest's order)
  int64_t shuffle_buffer = 4096;     // samples per shuffle block (and per bucketing block)
  std::string long_docs = "truncate";  // bucketed: a document over seq_len+1 tokens is truncated | split
  int64_t pad_multiple = 8;          // bucketed: pad a batch's length up to a multiple of this (1 = none)
  int64_t token_budget = 0;          // bucketed: > 0 = rows per rank chosen so rows*padded_len <= this
  std::string verify = "lazy";       // shard checksums: lazy (first open) | full (all at start)
  bool reuse_batch = false;          // benchmark only: every step re-trains the first batches (no reading)
};

}  // namespace lm
