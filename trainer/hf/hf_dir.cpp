// Hugging Face model directories (see hf_dir.h).
#include "trainer/hf/hf_dir.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>

#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "data/format/manifest.h"
#include "data/loader/loader.h"
#include "models/hf.h"
#include "models/registry.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/checkpoint/weights_reader.h"
#include "run/run_dir.h"

namespace lm {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Every tensor of `want` in `have` with the same shape, and nothing else; throws naming the first that is not.
void check_tensors(const std::string& file, const std::vector<TensorSpec>& want, const SafetensorsReader& have) {
  std::set<std::string> got(have.names().begin(), have.names().end());
  for (const auto& w : want) {
    if (!got.count(w.name)) throw CheckpointError(file + ": missing tensor '" + w.name + "'");
    const TensorSpec h = have.spec(w.name);
    if (h.shape != w.shape)
      throw CheckpointError(file + ": tensor '" + w.name + "' has shape " + shape_str(h.shape) + ", the config gives " +
                            shape_str(w.shape));
    got.erase(w.name);
  }
  if (!got.empty()) throw CheckpointError(file + ": unexpected tensor '" + *got.begin() + "'");
}

}  // namespace

ExportStats export_hf(const ModelConfig& model, const DataConfig& data_cfg, const std::string& run,
                      const std::string& weights_in, const std::string& out_dir) {
  // The run's copy of its tokenizer; a run written before runs carried one: its data, opened.
  const std::string tok_dir = run_dir::tokenizer(run);
  const bool carried = files::exists(tok_dir + "/manifest.json");
  const data::Manifest manifest = carried ? data::Manifest::load(tok_dir) : data::Manifest();
  const data::TrainData data = carried ? data::TrainData{} : data::open_train_data(data_cfg);
  const data::TokenizerInfo& tok = carried ? manifest.tokenizer : data.tokenizer();
  const std::string weights = weights_in.empty() ? run_dir::weights(run) : weights_in;
  if (!files::exists(weights)) throw CheckpointError(weights + ": no such weights file (has the run finished?)");
  const int64_t vocab = padded_vocab(model, static_cast<int64_t>(tok.vocab_size));
  // Tensor by tensor: the output's header from each converted alone (uninitialised values: only
  // the names and shapes are kept), then each read, converted and written in the header's order.
  const WeightsReader in(weights);
  ExportStats stats;
  auto convert = [&](const std::string& name, const torch::Tensor& t) {
    try {
      auto hf = to_hf(model, {{name, t}});
      const auto& out = hf.at(0).second;
      const bool shares = out.storage().is_alias_of(t.storage());
      stats.max_bytes = std::max<int64_t>(stats.max_bytes, t.nbytes() + (shares ? 0 : out.nbytes()));
      return hf.at(0);
    } catch (const std::out_of_range& e) {
      throw CheckpointError(in.what() + ": " + e.what());
    }
  };
  std::vector<TensorSpec> specs;
  std::map<std::string, std::string> ours_of;  // HF name -> ours
  for (const auto& name : in.names()) {
    const TensorSpec& s = in.spec(name);
    auto [hf_name, t] = convert(name, torch::empty(s.shape, torch::TensorOptions().dtype(s.dtype)));
    specs.push_back(TensorSpec::of(hf_name, t));
    ours_of[hf_name] = name;
  }
  files::make_dirs(out_dir);
  SafetensorsWriter out(out_dir + "/model.safetensors", specs, {{"format", "pt"}});
  for (const auto& s : out.order()) {
    const std::string& ours = ours_of.at(s.name);
    out.write(convert(ours, in.read(ours)).second);
    ++stats.tensors;
  }
  out.commit();
  files::write_file_atomic(out_dir + "/config.json",
                           hf_config(model, vocab, tok.eos_id, tok.pad_id).dump(2) + "\n");
  if (!tok.file.empty())
    files::write_file_atomic(out_dir + "/tokenizer.model",
                             carried ? files::read_file(tok_dir + "/" + tok.file) : data.tokenizer_model());
  return stats;
}

void init_from_hf(LMImpl& m, const std::string& dir, const WeightWriter& write) {
  if (dir.empty()) return;
  const std::string config = dir + "/config.json", weights = dir + "/model.safetensors";
  if (!files::exists(config)) throw CheckpointError(config + ": missing (model.init_from)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(files::read_file(config));
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(config + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) throw CheckpointError(config + ": not a JSON object (model.init_from)");
  const std::string want = hf_model_type(m.cfg.arch);
  if (j.value("model_type", std::string()) != want)
    throw CheckpointError(config + ": model_type '" + j.value("model_type", std::string()) + "', model.arch=" +
                          m.cfg.arch + " needs '" + want + "'");
  // Fields that change the math but not the tensors' shapes (heads, eps, RoPE, activation...):
  // compared before the tensors, so the field is named rather than a shape it implies.
  const std::string differs = hf_config_mismatch(m.cfg, m.vocab, j);
  if (!differs.empty()) throw CheckpointError(config + " (model.init_from): " + differs);
  // Tensor by tensor: the names and shapes checked first (each of ours converted alone), then each
  // read, converted and copied in (never the file's tensors all in memory beside the model's).
  const SafetensorsReader in(weights);
  std::vector<TensorSpec> specs;
  std::map<std::string, torch::Tensor> ours;
  for (const auto& [name, t] : module_tensors(m)) {
    ours[name] = t;
    const auto hf = to_hf(m.cfg, {{name, t}});
    specs.push_back(TensorSpec::of(hf.at(0).first, hf.at(0).second));
  }
  check_tensors(weights, specs, in);
  torch::NoGradGuard ng;
  for (const auto& name : in.names()) {
    const auto back = from_hf(m.cfg, {{name, in.read(name)}});
    auto& dst = ours.at(back.at(0).first);
    if (back.at(0).second.sizes() != dst.sizes())
      throw CheckpointError(weights + ": tensor '" + name + "' does not fit " + back.at(0).first);
    if (write) write(dst, back.at(0).second);
    else dst.copy_(back.at(0).second);
  }
  log::info("model.init_from: loaded " + std::to_string(in.names().size()) + " tensors from " + weights + " one at a time");
}

}  // namespace lm
