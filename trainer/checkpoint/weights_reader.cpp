// Weights one parameter at a time from a file or a checkpoint's parts (see weights_reader.h).
#include "trainer/checkpoint/weights_reader.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>

#include "common/errors.h"
#include "common/files.h"
#include "trainer/checkpoint/reader.h"
#include "trainer/optim/flat_state.h"

namespace lm {

WeightsReader::WeightsReader(const std::string& path) : what_(path) {
  if (!files::exists(path)) throw CheckpointError(path + ": no such weights file or checkpoint");
  auto whole = [&](const std::string& file) {  // one file of the whole tensors
    what_ = file;
    files_.push_back(std::make_unique<SafetensorsReader>(file));
    for (const auto& n : files_[0]->names()) specs_.emplace(n, files_[0]->spec(n)), names_.push_back(n);
  };
  if (!std::filesystem::is_directory(path)) {
    whole(path);
    return;
  }
  if (const std::string why = CheckpointReader::verify(path); !why.empty())
    throw CheckpointError(path + ": not a checkpoint that verifies (" + why + ")");
  if (files::exists(path + "/model.safetensors")) {
    whole(path + "/model.safetensors");
    return;
  }
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(files::read_file(path + "/state.json"));
    for (const auto& f : state.at("part_files").at("model")) files_.push_back(std::make_unique<SafetensorsReader>(path + "/" + f.get<std::string>()));
    for (const auto& [name, shape] : state.at("components").at("model").at("shapes").items())
      specs_.emplace(name, TensorSpec{name, torch::kFloat, shape.get<std::vector<int64_t>>()}), names_.push_back(name);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(path + "/state.json: no model file nor model parts with their shapes (" + e.what() + ")");
  }
  what_ = path + " (" + std::to_string(files_.size()) + " model parts)";
  std::sort(names_.begin(), names_.end());
  for (size_t p = 0; p < files_.size(); ++p)
    for (const auto& t : files_[p]->names()) {
      std::string name;
      int64_t a = 0, b = -1;
      if (!split_slice_name(t, &name, &a, &b) || b < 0)
        throw CheckpointError(what_ + ": tensor '" + t + "' is not a slice <param>[a:b]");
      if (!specs_.count(name)) throw CheckpointError(what_ + ": tensor '" + t + "' names no parameter of state.json's");
      slices_[name].push_back({p, t, a, b});
    }
  for (const auto& name : names_) {
    auto& s = slices_[name];
    std::sort(s.begin(), s.end(), [](const Slice& x, const Slice& y) { return x.begin < y.begin; });
    int64_t at = 0;
    for (const auto& sl : s) {
      if (sl.begin != at || sl.end < sl.begin) break;
      at = sl.end;
    }
    const int64_t numel = static_cast<int64_t>(specs_.at(name).bytes() / sizeof(float));
    if (at != numel)
      throw CheckpointError(what_ + ": parameter '" + name + "' put together from its slices covers values 0.." +
                            std::to_string(at) + " of " + std::to_string(numel) + " (a part missing, or parts overlapping)");
  }
}

WeightsReader::~WeightsReader() = default;

const TensorSpec& WeightsReader::spec(const std::string& name) const {
  auto it = specs_.find(name);
  if (it == specs_.end()) throw CheckpointError(what_ + ": no tensor '" + name + "'");
  return it->second;
}

torch::Tensor WeightsReader::read(const std::string& name) const {
  const TensorSpec& s = spec(name);
  if (slices_.empty()) return files_[0]->read(name);
  std::vector<torch::Tensor> pieces;
  for (const auto& sl : slices_.at(name)) pieces.push_back(files_[sl.part]->read(sl.tensor).reshape({-1}));
  return torch::cat(pieces).view(s.shape);
}

NamedTensors WeightsReader::read_all() const {
  NamedTensors out;
  for (const auto& n : names_) out.emplace_back(n, read(n));
  return out;
}

}  // namespace lm
