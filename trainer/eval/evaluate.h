// Validation: the mean loss over eval.batches micro-batches of the validation split, always the
// same ones (the reader restarts each time), split over the ranks and summed with one all-reduce.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "data/format/manifest.h"
#include "data/loader/val_reader.h"
#include "models/lm.h"
#include "data/loader/data_config.h"
#include "run/config/eval_config.h"

namespace lm {

class Comm;

// What an evaluation needs besides its config sections: the run's facts.
struct EvalRuntime {
  int64_t seq_len = 0;     // model.seq_len
  int64_t batch_rows = 8;  // rows per forward (train.micro_batch_size)
  torch::Device device = torch::kCPU;
  bool bf16 = false;       // train.dtype=bf16: forwards under autocast
  // With world > 1 every rank runs the same number of forwards, whatever the parallelism (one that
  // keeps the weights in parts, ZeRO-3, gathers them inside the forwards): a rank short of batches
  // runs one more forward and drops its loss. The ranks wait for the slowest at the all-reduce all
  // the same.
  int rank = 0, world = 1;
};

class Evaluator {
 public:
  // The validation data (`data`: data.val, its verification and the remote store's options): data.val,
  // else the `val` split of the training set, else (no val split) its `train` split, with a warning,
  // and every record says so (split()). nullptr when eval.batches is 0 or there is too little data
  // (logged). Throws ConfigError (exit 2) when data.val was made with another tokenizer than
  // data.train.
  static std::unique_ptr<Evaluator> create(const EvalConfig& eval, const DataConfig& data,
                                           const data::Manifest& train, const EvalRuntime& rt);
  // Mean validation loss of `model` (eval mode during the pass, train mode after); with `comm` the
  // batches are split over the ranks and summed with one all-reduce.
  double mean_loss(LM& model, Comm* comm);
  const std::string& dir() const { return manifest_.dir; }
  const std::string& split() const { return split_; }  // "val", or "train" when there is none

 private:
  Evaluator(int64_t batches, data::Manifest m, const std::string& split, bool verify_full, const EvalRuntime& rt);
  int64_t batches_;  // eval.batches
  data::Manifest manifest_;
  std::string split_;
  std::unique_ptr<data::ValReader> reader_;
  EvalRuntime rt_;
};

}  // namespace lm
