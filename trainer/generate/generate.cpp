// Sampling and the `generate` command (see generate.h).
#include "trainer/generate/generate.h"

#include <CLI/CLI.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdlib>
#include <iostream>

#include "data/tokenizer/tokenizer.h"
#include "run/config/config.h"
#include "trainer/runtime/device.h"
#include "trainer/cli.h"
#include "common/errors.h"
#include "common/files.h"
#include "models/build.h"
#include "trainer/checkpoint/safetensors.h"
#include "trainer/checkpoint/weights_reader.h"
#include "run/run_dir.h"

namespace lm {
namespace {

// What names a run's tokenizer: the copy in its directory; a run written before runs carried one,
// data.tokenizer when it reads raw text, else its first dataset.
std::string tokenizer_of(const std::string& run, const DataConfig& d) {
  if (files::exists(run_dir::tokenizer(run) + "/manifest.json")) return run_dir::tokenizer(run);
  for (const auto& s : d.sources)
    if (!s.text.empty()) return d.tokenizer;
  return d.sources.at(0).path;
}

}  // namespace

std::vector<int64_t> generate(LM& model, std::vector<int64_t> prompt, const SampleOptions& opt) {
  TORCH_CHECK(!prompt.empty(), "generate: empty prompt");
  torch::NoGradGuard ng;
  model->eval();
  const auto device = model->parameters().front().device();
  const int64_t T = model->cfg.seq_len;
  KVCache cache;
  int64_t cache_start = 0;  // index in `prompt` of the cache's position 0
  for (int64_t i = 0; i < opt.max_new_tokens; ++i) {
    const int64_t n = static_cast<int64_t>(prompt.size());
    int64_t start = std::max<int64_t>(0, n - T);
    if (opt.doc_eos >= 0)  // data.doc_mask: the last token's document (it may end with the EOS itself)
      for (int64_t j = n - 2; j >= start; --j)
        if (prompt[static_cast<size_t>(j)] == opt.doc_eos) {
          start = j + 1;
          break;
        }
    // The context is prompt[start, n); the cache serves while it starts there too (once the
    // context slides past seq_len, each step fills it anew).
    if (!opt.kv_cache || start != cache_start) cache.clear(), cache_start = start;
    auto idx = torch::tensor(std::vector<int64_t>(prompt.begin() + start + cache.pos, prompt.end()), torch::kLong)
                   .view({1, -1}).to(device);
    auto out = opt.kv_cache ? model->forward(idx, &cache) : model->forward(idx);
    auto logits = out.select(1, idx.size(1) - 1).squeeze(0).to(torch::kFloat);  // (V,)
    if (opt.vocab_limit > 0 && opt.vocab_limit < logits.size(0)) logits = logits.slice(0, 0, opt.vocab_limit);
    if (opt.temperature == 0) {
      prompt.push_back(logits.argmax().item<int64_t>());
      continue;
    }
    logits = logits / opt.temperature;
    if (opt.top_k > 0 && opt.top_k < logits.size(0)) {
      auto kth = std::get<0>(logits.topk(opt.top_k)).select(0, opt.top_k - 1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    prompt.push_back(torch::multinomial(torch::softmax(logits, 0), 1).item<int64_t>());
  }
  return prompt;
}

int generate_cli(int argc, char** argv) {
  CLI::App app{"Generate text from a trained model."};
  std::string run, weights, data_dir, prompt;
  SampleOptions opt;
  int64_t seed = 1, samples = 1, threads = 0;
  app.add_option("--run", run, "run directory (its config.yaml and model.safetensors)")->required();
  app.add_option("--weights", weights, "weights file or checkpoint directory (default RUN/model.safetensors)");
  app.add_option("--data", data_dir, "prepared data directory, sentencepiece .model or bytes: the tokenizer (default: the run's)");
  app.add_option("--prompt", prompt, "text to continue (default: start of a document)");
  app.add_option("--tokens", opt.max_new_tokens, "tokens to generate")->check(CLI::Range(1, 1 << 20));
  // A finite number >= 0, 0 = greedy (CLI::NonNegativeNumber lets nan and inf through).
  const CLI::Validator finite_nonneg(
      [](std::string& s) {
        char* end = nullptr;
        const double v = std::strtod(s.c_str(), &end);
        return end != s.c_str() && *end == '\0' && std::isfinite(v) && v >= 0 ? std::string()
                                                                          : "expected a finite number >= 0, got '" + s + "'";
      },
      "NONNEGATIVE");
  app.add_option("--temperature", opt.temperature, "sampling temperature; 0 = greedy")->check(finite_nonneg);
  app.add_option("--top-k", opt.top_k, "sample among the k most likely tokens; 0 = all")->check(CLI::NonNegativeNumber);
  app.add_option("--seed", seed, "random seed");
  app.add_option("--samples", samples, "number of samples")->check(CLI::Range(1, 1000));
  bool no_cache = false;
  app.add_flag("--no-kv-cache", no_cache, "recompute the whole context for every token");
  app.add_option("--threads", threads, "CPU threads; 0 = default")->check(CLI::NonNegativeNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    std::cout << app.help();
    return kExitOk;
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
  opt.kv_cache = !no_cache;
  set_math_threads(threads);
  auto cfg = load_config(run_dir::config(run), {});
  if (weights.empty()) weights = run_dir::weights(run);
  auto tok = data::load_tokenizer_isolated(data_dir.empty() ? tokenizer_of(run, cfg.data) : data_dir);
  const int64_t data_vocab = static_cast<int64_t>(tok->info().vocab_size);
  LM model = build_model(cfg.model, padded_vocab(cfg.model, data_vocab));
  const WeightsReader reader(weights);  // a weights file or a checkpoint directory (whole or in parts)
  load_into_module(*model, reader.read_all(), reader.what());
  opt.vocab_limit = data_vocab;
  const auto eos = static_cast<int64_t>(tok->info().eos_id);
  if (cfg.data.doc_mask) opt.doc_eos = eos;  // the prompt is one document, positions from 0 (generate.h)
  std::vector<int64_t> ids{eos};
  for (auto t : tok->encode(prompt)) ids.push_back(t);
  torch::manual_seed(static_cast<uint64_t>(seed));
  for (int64_t s = 0; s < samples; ++s) {
    auto out = generate(model, ids, opt);
    // Documents are separated by EOS: print each on its own line.
    std::string text;
    std::vector<uint32_t> doc;
    for (size_t i = 1; i <= out.size(); ++i) {
      if (i == out.size() || out[i] == eos) {
        if (!text.empty() || !doc.empty()) text += tok->decode(doc) + "\n";
        doc.clear();
      } else {
        doc.push_back(static_cast<uint32_t>(out[i]));
      }
    }
    if (samples > 1) std::cout << "--- sample " << s + 1 << " ---\n";
    std::cout << text << std::flush;
  }
  return kExitOk;
}

}  // namespace lm
