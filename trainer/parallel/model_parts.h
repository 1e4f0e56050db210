// The model and what updates it, built as one: the module of model.arch (model.init_from applied,
// on the device), its parameters in one flat buffer, AdamW over it, and the EMA when
// train.ema_decay > 0. Built from the shared seed, so every rank starts from the same weights; each
// rank's own dropout stream is seeded after.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "models/lm.h"
#include "trainer/checkpoint/state.h"
#include "run/config/config.h"
#include "trainer/optim/optimizer.h"
#include "trainer/parallel/parallel.h"
#include "trainer/optim/ema.h"
#include "trainer/runtime/rng.h"

namespace lm {

struct ModelParts {
  LM model{nullptr};
  std::unique_ptr<FlatParams> flat;
  std::unique_ptr<Parallelism> parallel;  // how the ranks share the work (dist:, trainer/parallel/)
  std::unique_ptr<Optimizer> opt;         // over the ranges `parallel` gives this rank
  std::unique_ptr<Ema> ema;  // null when train.ema_decay is 0
  int64_t params = 0;
  double flops_per_token = 0;  // at model.seq_len (models/registry.h)
  std::unique_ptr<ModuleState> model_state;  // the model's checkpoint component (register_state)

  // What the optimizer and the EMA ask before they write what a snapshot may still be copying.
  void set_fence(WriteFence* f) {
    opt->set_fence(f);
    if (ema) ema->set_fence(f);
  }
  // The model, the optimizer, the EMA and what the parallelism keeps, each under its fixed key
  // (trainer/checkpoint/state.h), whole or as this rank's part as the parallelism keeps them.
  // resume_dir: the checkpoint the model's state is restored from (named in messages; may be "").
  void register_state(StateRegistry& state, const std::string& resume_dir);
  // fn() (a forward pass outside the step: validation) with the EMA's weights in place of the
  // model's, the model's put back after. REQUIRES: ema.
  double with_ema_weights(const std::function<double()>& fn);
  // The final weights (safetensors, format "pt", with the architecture and the step), written by
  // rank 0. Every rank calls it (it may communicate): weights kept in parts (the parallelism's
  // weights_part) are gathered one tensor at a time, never all at once.
  void save_weights(const std::string& path, const std::string& arch, int64_t step, int rank) const;
};

// vocab: the padded vocabulary; data_vocab: the data's (for the log line); eos_id: the data's EOS,
// whose documents the model keeps apart under data.doc_mask (Numerics::doc_eos). comm: the run's
// process group (nullptr: none). The optimizer is built over the ranges of the flat parameters the
// parallelism gives this rank. Throws ConfigError for optim.fused, optim.free_grads or
// optim.clip_in_step (resolve_grad_path) before building anything.
ModelParts build_model_parts(const ExperimentConfig& cfg, int64_t vocab, int64_t data_vocab, int64_t eos_id,
                             const torch::Device& device, RngStreams& rng, Comm* comm, int rank, int world);

}  // namespace lm
