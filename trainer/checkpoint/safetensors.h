// safetensors files (https://github.com/huggingface/safetensors): 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}} padded with
// spaces to a multiple of 8, then the raw little-endian tensor bytes in header order.
//
// Deterministic: tensors are written sorted by name, the header has no timestamps, so identical
// state gives a byte-identical file. Written atomically (temp, fsync, rename).
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/files.h"
#include "common/torch/stateful.h"

namespace lm {

// The file's layout: its head (8-byte header length + JSON header) and its tensors in file order
// (sorted by name, contiguous, on their own device), data_bytes of them after the head.
struct SafetensorsLayout {
  std::string head;
  NamedTensors tensors;
  uint64_t data_bytes = 0;
  uint64_t size() const { return head.size() + data_bytes; }
};
SafetensorsLayout safetensors_layout(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata = {});

// The file as a write plan (head = length + JSON header, spans = tensor bytes), for writers that
// stream it themselves (checkpoints). `keep` holds the CPU-contiguous tensors the spans point into:
// views of the originals when those already are (no copy), so the spans see later in-place updates.
struct SafetensorsPlan {
  files::FilePlan plan;
  std::vector<torch::Tensor> keep;
};
SafetensorsPlan plan_safetensors(const std::string& name, const NamedTensors& tensors,
                                 const std::map<std::string, std::string>& metadata = {});

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Tensors on CPU, sorted by name, read straight into their memory in one pass. With expect_xxh64
// (16 hex digits) the file's checksum is computed in that pass and must match. Throws
// CheckpointError naming the file when it is malformed, short or does not match.
NamedTensors load_safetensors(const std::string& path, std::map<std::string, std::string>* metadata = nullptr,
                              const std::string& expect_xxh64 = "");

// Copies `tensors` into the module's parameters and buffers by name. Throws CheckpointError naming
// the first missing, unexpected or mis-shaped tensor.
void load_into_module(torch::nn::Module& m, const NamedTensors& tensors, const std::string& what);
// The module's parameters and buffers as (name, tensor) pairs.
NamedTensors module_tensors(const torch::nn::Module& m);

}  // namespace lm
