// The modules of the registry (models/registry.h): model.arch -> a freshly initialised LM.
#pragma once

#include "models/lm.h"
#include "models/model_config.h"
#include "models/registry.h"

namespace lm {

// The module of c.arch over a padded vocabulary (padded_vocab()), initialised from the default
// generator. Throws ConfigError for an unknown architecture.
LM build_model(const ModelConfig& c, int64_t vocab);

// The same module with every parameter a placeholder on `device` (lm.h: its shape, no memory), for
// a keeper of the weights that places them itself (trainer/parallel/model_parts.h): the architecture's
// submodules are made one after another and each one's parameters released at once, so at most one
// block's weights (or the embedding) exist at a time. The caller then calls init_weights(write),
// which draws each parameter whole, one at a time: with nothing drawn from the default generator in
// between, every value is build_model's.
LM build_model_deferred(const ModelConfig& c, int64_t vocab, const torch::Device& device);

}  // namespace lm
