// safetensors files (https://github.com/huggingface/safetensors): 8-byte little-endian header
// length, a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {...}} padded with
// spaces to a multiple of 8, then the raw little-endian tensor bytes in header order.
//
// Deterministic: tensors are written sorted by name, the header has no timestamps, so identical
// state gives a byte-identical file. Written atomically (temp, fsync, rename).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/files.h"
#include "common/torch/stateful.h"

namespace lm {

// A tensor's place in a header: name, dtype and shape (no data).
struct TensorSpec {
  std::string name;
  torch::ScalarType dtype = torch::kFloat;
  std::vector<int64_t> shape;
  static TensorSpec of(const std::string& name, const torch::Tensor& t) { return {name, t.scalar_type(), t.sizes().vec()}; }
  uint64_t bytes() const {
    uint64_t n = c10::elementSize(dtype);
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    return n;
  }
};
// The head (8-byte header length + JSON header) of a file of `specs`, sorted by name here (the
// order their data follows); *data_bytes: the data section's size.
std::string safetensors_head(std::vector<TensorSpec>* specs, const std::map<std::string, std::string>& metadata,
                             uint64_t* data_bytes);

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

// A file written one tensor at a time, for writers that never hold all of them (the final weights
// gathered tensor by tensor, an export converting them one by one): the same bytes as
// save_safetensors of the same tensors. Written atomically (common/files.h AtomicFile: destroyed
// without commit(), nothing is left).
class SafetensorsWriter {
 public:
  // The header of `specs` written; the tensors then go in order() (sorted by name).
  SafetensorsWriter(const std::string& path, std::vector<TensorSpec> specs,
                    const std::map<std::string, std::string>& metadata = {});
  const std::vector<TensorSpec>& order() const { return specs_; }
  // The next tensor of order(). Throws Error for another dtype or shape than its spec, or one too many.
  void write(const torch::Tensor& t);
  // Throws Error unless every tensor was written; then fsync, rename, fsync of the directory.
  void commit();

 private:
  std::string path_;
  files::AtomicFile file_;
  std::vector<TensorSpec> specs_;
  size_t next_ = 0;
};

// A file read one tensor at a time (its header parsed and checked at construction, each tensor read
// when asked): for readers that never hold all of them (export). No checksum. Throws
// CheckpointError naming the file when it is malformed or short.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  const std::vector<std::string>& names() const { return names_; }  // sorted
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  TensorSpec spec(const std::string& name) const;  // throws CheckpointError for a name it has not
  torch::Tensor read(const std::string& name) const;  // on the CPU, a tensor of its own

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::vector<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// Throws CheckpointError (what: the file) unless tensor `name` read as `t` has the shape `want` its
// parameter has.
void check_tensor_shape(const std::string& what, const std::string& name, const torch::Tensor& t, at::IntArrayRef want);
// Copies `tensors` into the module's parameters and buffers by name. Throws CheckpointError naming
// the first missing, unexpected or mis-shaped tensor.
void load_into_module(torch::nn::Module& m, const NamedTensors& tensors, const std::string& what);
// The module's parameters and buffers as (name, tensor) pairs.
NamedTensors module_tensors(const torch::nn::Module& m);

}  // namespace lm
