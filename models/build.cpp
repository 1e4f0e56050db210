// model.arch -> module (see build.h).
#include "models/build.h"

#include "common/errors.h"
#include "models/gpt.h"
#include "models/llama.h"

namespace lm {

LM build_model(const ModelConfig& c, int64_t vocab) {
  validate_model(c);
  if (c.arch == "gpt") return LM(std::static_pointer_cast<LMImpl>(GPT(c, vocab).ptr()));
  if (c.arch == "llama") return LM(std::static_pointer_cast<LMImpl>(Llama(c, vocab).ptr()));
  throw ConfigError("key 'model.arch': unknown architecture '" + c.arch + "'");
}

}  // namespace lm
