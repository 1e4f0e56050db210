// model.arch -> module (see build.h).
#include "models/build.h"

#include "common/errors.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace lm {

namespace {
LM build_arch(const ModelConfig& c, int64_t vocab, const torch::Device* deferred) {
  validate_model(c);
  if (c.arch == "gpt") return LM(std::static_pointer_cast<LMImpl>(GPT(c, vocab, deferred).ptr()));
  if (c.arch == "llama") return LM(std::static_pointer_cast<LMImpl>(Llama(c, vocab, deferred).ptr()));
  throw ConfigError("key 'model.arch': unknown architecture '" + c.arch + "'");
}
}  // namespace

LM build_model(const ModelConfig& c, int64_t vocab) { return build_arch(c, vocab, nullptr); }

LM build_model_deferred(const ModelConfig& c, int64_t vocab, const torch::Device& device) {
  return build_arch(c, vocab, &device);
}

}  // namespace lm
