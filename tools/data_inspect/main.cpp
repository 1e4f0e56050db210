// `data-inspect`: what the loader of a config feeds the model, without training (torch-free).
//
//   data-inspect --config CFG.yaml [--set key=value ...] [--batch N] [--world-size W] [--mixture]
//
// Prints one JSON object:
//   mixture  the planned mixture per stage: each stage's end (step or tokens) and every source's
//            normalised token weight; with each source's directory, data version, train tokens and
//            samples per epoch (data.train: the one source "train")
//   batch    (unless --mixture) global micro-batch N (0-based; step N / train.grad_accum) as the
//            trainer with W ranks reads it: per rank, per row the source, shard (index and file),
//            document index and token offset where the row starts, and its target tokens; and
//            the global batch's target tokens per source. With dist.invariant (the loader's step
//            blocks, as the trainer reads them): "invariant", the step's G = W x train.grad_accum
//            global micro-batches of train.micro_batch_size rows and their deal, per rank its
//            [first, last) (data::step_block, the trainer's deal); each rank's entry says its block
//            ("micro_batches") and which global micro-batch of the step its rows are ("micro_batch").
// Exit codes: 0; 2 with one line for a bad config, data or command line.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/log.h"
#include "data/loader/loader.h"
#include "run/config/config.h"

namespace lm {
namespace {

nlohmann::json planned_mixture(const DataConfig& c, const data::TrainData& d, const std::vector<int64_t>& n) {
  const auto& names = d.names;
  const auto& m = d.sources;
  nlohmann::json sources = nlohmann::json::array(), stages = nlohmann::json::array();
  for (size_t i = 0; i < m.size(); ++i)
    sources.push_back({{"name", names[i]}, {"dir", m[i].dir}, {"data_version", m[i].data_version},
                       {"train_tokens", m[i].split_tokens("train")}, {"samples_per_epoch", n[i]},
                       {"max_epochs", c.sources[i].max_epochs}});
  auto normalised = [&](const std::vector<double>& w) {
    double sum = 0;
    for (double x : w) sum += x;
    nlohmann::json out = nlohmann::json::object();
    for (size_t i = 0; i < w.size(); ++i) out[names[i]] = w[i] / sum;
    return out;
  };
  std::vector<double> base;
  for (size_t i = 0; i < m.size(); ++i) base.push_back(c.sources[i].weight);
  if (c.stages.empty()) stages.push_back({{"until", nullptr}, {"weights", normalised(base)}});
  for (const auto& st : c.stages) {
    std::vector<double> w(m.size(), 0.0);
    for (const auto& [name, v] : st.weights)
      for (size_t i = 0; i < names.size(); ++i)
        if (names[i] == name) w[i] = v;
    nlohmann::json until = st.until_tokens > 0 ? nlohmann::json{{"tokens", st.until_tokens}}
                           : st.until_step > 0 ? nlohmann::json{{"step", st.until_step}} : nlohmann::json(nullptr);
    stages.push_back({{"until", until}, {"weights", normalised(w)}});
  }
  return {{"sources", sources}, {"stages", stages}, {"data_version", d.version}};
}

nlohmann::json batch_json(const ExperimentConfig& cfg, const data::TrainData& d, uint64_t index, int world) {
  const auto& names = d.names;
  const auto& m = d.sources;
  nlohmann::json ranks = nlohmann::json::array(), tokens = nlohmann::json::object();
  const int64_t accum = cfg.train.grad_accum;
  const bool invariant = cfg.dist.invariant;
  const auto in_step = static_cast<int64_t>(index % static_cast<uint64_t>(accum));  // each rank's micro-batch of its step
  for (int r = 0; r < world; ++r) {
    auto l = std::make_unique<data::Loader>(cfg.data, m, "train", cfg.model.seq_len, cfg.train.micro_batch_size, r,
                                            world, static_cast<uint64_t>(cfg.run.seed), accum,
                                            /*step_blocks=*/invariant);
    data::Batch b;
    for (uint64_t k = 0; k <= index; ++k) b = l->next();
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t i = 0; i < b.rows; ++i) {
      const auto& o = b.origins[static_cast<size_t>(i)];
      int64_t targets = 0;
      for (int64_t t = 0; t < b.cols; ++t) targets += b.targets[static_cast<size_t>(i * b.cols + t)] != -1;
      rows.push_back({{"source", names[o.source]}, {"shard", o.shard}, {"shard_file", m[o.source].shards.at(o.shard).file},
                      {"doc", o.doc}, {"offset", o.offset}, {"target_tokens", targets}});
    }
    nlohmann::json entry = {{"rank", r}, {"epoch", b.epoch}, {"rows", rows}};
    if (invariant) {
      const data::StepBlock block = data::step_block(r, accum);
      entry["micro_batches"] = {block.first, block.last};
      entry["micro_batch"] = block.at(in_step);
    }
    ranks.push_back(entry);
    for (size_t s = 0; s < b.source_tokens.size(); ++s) tokens[names[s]] = b.source_tokens[s];
  }
  nlohmann::json out = {{"index", index}, {"step", index / static_cast<uint64_t>(accum)}, {"world_size", world},
                        {"source_tokens", tokens}, {"ranks", ranks}};
  if (invariant) {
    nlohmann::json deal = nlohmann::json::array();
    for (int r = 0; r < world; ++r) {
      const data::StepBlock block = data::step_block(r, accum);
      deal.push_back({block.first, block.last});
    }
    out["invariant"] = {{"global_micro_batches", static_cast<int64_t>(world) * accum},
                        {"micro_batch_size", cfg.train.micro_batch_size}, {"deal", deal}};
  }
  return out;
}

int run(int argc, char** argv) {
  std::string config;
  std::vector<std::string> sets;
  uint64_t batch = 0;
  int world = 1;
  bool mixture_only = false;
  CLI::App app{"data-inspect: the documents of a global batch of a config, and its planned mixture per stage"};
  app.add_option("--config", config, "experiment YAML")->required();
  app.add_option("--set", sets, "key=value override (repeatable)");
  app.add_option("--batch", batch, "global micro-batch index (0-based)");
  app.add_option("--world-size", world, "ranks the batch is dealt to")->check(CLI::Range(1, 1024));
  app.add_flag("--mixture", mixture_only, "only the planned mixture");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  log::init("", false);
  const ExperimentConfig cfg = load_config(config, sets);
  const data::TrainData d = data::open_train_data(cfg.data);
  std::vector<int64_t> per_epoch;
  for (size_t i = 0; i < d.sources.size(); ++i) {
    DataConfig one = cfg.data;
    one.sources = {cfg.data.sources[i]}, one.stages.clear();
    per_epoch.push_back(data::Loader(one, {d.sources[i]}, "train", cfg.model.seq_len, 1, 0, 1, 0).samples_per_epoch());
  }
  nlohmann::json out = {{"mixture", planned_mixture(cfg.data, d, per_epoch)}};
  if (!mixture_only) out["batch"] = batch_json(cfg, d, batch, world);
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace lm

int main(int argc, char** argv) {
  return lm::run_main("data-inspect", [&] { return lm::run(argc, argv); });
}
