// The modules of the registry (models/registry.h): model.arch -> a freshly initialised LM.
#pragma once

#include "models/lm.h"
#include "models/model_config.h"
#include "models/registry.h"

namespace lm {

// The module of c.arch over a padded vocabulary (padded_vocab()), initialised from the default
// generator. Throws ConfigError for an unknown architecture.
LM build_model(const ModelConfig& c, int64_t vocab);

}  // namespace lm
