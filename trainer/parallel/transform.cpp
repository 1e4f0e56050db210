// Model transforms (see transform.h).
#include "trainer/parallel/transform.h"

#include "common/log.h"

namespace lm {

ModelTransforms model_transforms(const ExperimentConfig&) { return {}; }

void apply_model_transforms(torch::nn::Module& model, const ModelTransforms& transforms, const TransformContext& ctx) {
  for (const auto& t : transforms) {
    t->apply(model, ctx);
    if (ctx.rank == 0) log::info("model transform: " + t->name() + " applied at " + std::to_string(ctx.world) + " rank(s)");
  }
}

}  // namespace lm
