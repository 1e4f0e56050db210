// The optimizers by name (see optimizer.h).
#include "trainer/optim/optimizer.h"

#include "common/errors.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/muon.h"

namespace lm {

std::unique_ptr<Optimizer> make_optimizer(FlatParams& flat, const OptimConfig& cfg,
                                          std::optional<std::vector<FlatRange>> owned) {
  // Whatever runs, the gradient path came from its row (resolve_grad_path): never a grad_scale
  // an optimizer would ignore.
  TORCH_CHECK(!flat.path().clip_in_step || optimizer_kind(cfg.name).grad_scale,
              "make_optimizer: clip_in_step for ", cfg.name, ", which has no grad_scale");
  if (cfg.name == "adamw") return std::make_unique<AdamW>(flat, cfg, std::move(owned));
  if (cfg.name == "muon") return std::make_unique<Muon>(flat, cfg, std::move(owned));
  throw ConfigError("optim.name: no optimizer '" + cfg.name + "' in this build");  // the config refuses it first
}

}  // namespace lm
