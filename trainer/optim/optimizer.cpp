// The optimizers by name (see optimizer.h).
#include "trainer/optim/optimizer.h"

#include "common/errors.h"
#include "trainer/optim/adamw.h"

namespace lm {

std::unique_ptr<Optimizer> make_optimizer(FlatParams& flat, const OptimConfig& cfg,
                                          std::optional<std::vector<FlatRange>> owned) {
  if (cfg.name == "adamw") return std::make_unique<AdamW>(flat, cfg, std::move(owned));
  throw ConfigError("optim.name: no optimizer '" + cfg.name + "' in this build");  // the config refuses it first
}

}  // namespace lm
