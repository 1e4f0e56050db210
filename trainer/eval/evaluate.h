// Validation: the mean loss over eval.batches micro-batches of the validation split, always the
// same ones (the reader restarts each time), split over the ranks and summed with one all-reduce.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>

#include "data/format/manifest.h"
#include "data/loader/val_reader.h"
#include "models/lm.h"
#include "trainer/config.h"

namespace lm {

class Comm;

class Evaluator {
 public:
  // The validation data: data.val, else the `val` split of the training set, else (no val split)
  // its `train` split, with a warning, and every record says so (split()). nullptr when
  // eval.batches is 0 or there is too little data (logged). Throws ConfigError (exit 2) when
  // data.val was made with another tokenizer than data.train.
  static std::unique_ptr<Evaluator> create(const ExperimentConfig& cfg, const data::Manifest& train,
                                           const torch::Device& device, int rank, int world);
  // Mean validation loss of `model` (eval mode during the pass, train mode after); with `comm` the
  // batches are split over the ranks and summed with one all-reduce.
  double mean_loss(LM& model, Comm* comm);
  // Whether a validation runs after optimizer step `step`: every eval.every_steps steps but the
  // last (the end of the run validates once, whatever the step).
  bool due(int64_t step) const {
    return cfg_.eval.due(step, cfg_.train.max_steps);
  }
  const std::string& dir() const { return manifest_.dir; }
  const std::string& split() const { return split_; }  // "val", or "train" when there is none

 private:
  Evaluator(const ExperimentConfig& cfg, data::Manifest m, const std::string& split, const torch::Device& device,
            int rank, int world);
  const ExperimentConfig& cfg_;
  data::Manifest manifest_;
  std::string split_;
  std::unique_ptr<data::ValReader> reader_;
  torch::Device device_;
  int rank_, world_;
  bool bf16_;
};

}  // namespace lm
