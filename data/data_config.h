// Configuration of the training data (YAML section `data:`). Torch-free.
#pragma once

#include <string>

namespace lm {

struct DataConfig {
  std::string train;  // directory written by `prep` (its manifest.json); required
  std::string val;    // directory for validation; empty = the `val` split of `train`
};

}  // namespace lm
