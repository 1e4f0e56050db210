// A run's weights read one parameter at a time, whole and in its shape, wherever they were saved:
// a weights file (RUN/model.safetensors, any safetensors file of the model's tensors) or a
// checkpoint directory, whose model is one file or, from a ZeRO-3 run, one part per rank (each
// rank's slices, "<param>[a:b]", put together here parameter by parameter; the shapes from the
// checkpoint's state.json). For the tools that never need all of them at once (export), and those
// that do (generate: read_all).
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/checkpoint/safetensors.h"

namespace lm {

class WeightsReader {
 public:
  // Throws CheckpointError naming the file or directory: missing, a checkpoint that does not verify
  // (manifest.json's checksums, every file read), parts that leave a value out or overlap.
  explicit WeightsReader(const std::string& path);
  ~WeightsReader();
  const std::vector<std::string>& names() const { return names_; }  // sorted
  const TensorSpec& spec(const std::string& name) const;
  torch::Tensor read(const std::string& name) const;  // a tensor of its own
  NamedTensors read_all() const;
  // "RUN/model.safetensors", or "DIR (2 parts)": what the messages name.
  const std::string& what() const { return what_; }

 private:
  struct Slice {
    size_t part;
    std::string tensor;
    int64_t begin, end;
  };
  std::string what_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;  // the file, or the parts in rank order
  std::vector<std::string> names_;
  std::map<std::string, TensorSpec> specs_;
  std::map<std::string, std::vector<Slice>> slices_;  // parts: each parameter's, in order
};

}  // namespace lm
