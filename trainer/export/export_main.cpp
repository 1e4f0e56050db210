// build/bin/export --run RUN_DIR --format hf OUT_DIR [--weights FILE]
//
// Writes the run's weights as a Hugging Face model directory (model.safetensors with HF names,
// config.json for transformers, the tokenizer model): see trainer/hf/hf_dir.h.
#include <CLI/CLI.hpp>

#include <iostream>

#include "common/errors.h"
#include "trainer/hf/hf_dir.h"
#include "run/config/config.h"
#include "run/run_dir.h"

int main(int argc, char** argv) {
  return lm::run_main("export", [&] {
    CLI::App app{"Export a trained run's weights in another format."};
    std::string run, format, out, weights;
    app.add_option("--run", run, "run directory (its config.yaml and model.safetensors)")->required();
    app.add_option("--format", format, "output format")->required()->check(CLI::IsMember({"hf"}));
    app.add_option("--weights", weights, "weights file or checkpoint directory (default RUN/model.safetensors)");
    app.add_option("OUT_DIR", out, "output directory")->required();
    try {
      app.parse(argc, argv);
    } catch (const CLI::CallForHelp&) {
      std::cout << app.help();
      return lm::kExitOk;
    } catch (const CLI::ParseError& e) {
      throw lm::UsageError(e.what());
    }
    const lm::ExperimentConfig cfg = lm::load_config(lm::run_dir::config(run), {});  // the run's config.yaml
    const auto stats = lm::export_hf(cfg.model, cfg.data, run, weights, out);
    std::cout << "wrote " << out << "/model.safetensors, config.json (" << stats.tensors
              << " tensors streamed, at most " << stats.max_bytes << " bytes of them held at once)\n";
    return lm::kExitOk;
  });
}
