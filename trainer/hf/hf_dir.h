// Hugging Face model directories: `export --format hf` writes one from a run, `model.init_from`
// starts a run from one. The names and layouts are models/hf.h's.
//
// A directory holds model.safetensors (HF tensor names, fp32), config.json (transformers'
// LlamaConfig / GPT2Config fields) and, for a sentencepiece dataset, tokenizer.model (the
// dataset's model file, byte for byte).
#pragma once

#include <string>

#include "data/loader/data_config.h"
#include "models/lm.h"
#include "models/model_config.h"

namespace lm {

// What an export streamed: tensors written, and the most bytes of tensors it held at once (a
// tensor read and its conversion).
struct ExportStats {
  int64_t tensors = 0, max_bytes = 0;
};
// Writes OUT_DIR from the run's model: and data: sections (its config.yaml, read by the caller),
// the run directory `run` (its tokenizer) and `weights` (default RUN/model.safetensors; a weights
// file or a checkpoint directory, its model whole or in ZeRO-3's parts: trainer/checkpoint/
// weights_reader.h), one tensor at a time, never all of them in memory. Throws ConfigError /
// DataError / CheckpointError naming the file at fault.
ExportStats export_hf(const ModelConfig& model, const DataConfig& data, const std::string& run,
                      const std::string& weights, const std::string& out_dir);

// Loads DIR's weights into m (nothing when dir is empty). Refuses (CheckpointError naming the file)
// a config.json of another model_type or whose fields describe another computation than m's
// (models/hf.h hf_config_mismatch: heads, kv heads, head_dim, eps, RoPE theta and scaling,
// activation, biases, tied head, vocabulary..., naming the field and both values), and a
// model.safetensors whose tensors are missing, extra, or of another shape than m's (naming the
// first such HF tensor and both shapes).
// write: where each tensor's values go (models/lm.h WeightWriter: the keeper of a deferred build's
// weights); unset: copied into m's parameters.
void init_from_hf(LMImpl& m, const std::string& dir, const WeightWriter& write = nullptr);

}  // namespace lm
