// What fits on a node, from the memory check's own formula (trainer/parallel/memory_check.h
// estimate_memory, the numbers a CUDA run's start-up check uses): for GPT and Llama shapes of the
// usual ladders, each ZeRO stage, and activation checkpointing off and on, the per-rank estimate at
// --world ranks of --gb GB each, and the largest shape that fits. Nothing is allocated; no GPU is
// needed. The window: weights, gradients, optimizer state and EMA as each stage keeps them per rank
// (rank_bytes), one micro-batch's activations and logits; not the CUDA context, the allocator's
// fragmentation or NCCL's buffers (hence --gb below the card's size by default).
//
//   build/bin/zero_fit                         # 8 ranks x 80 GB, micro-batch 1 x 2048, bf16, EMA off
//   build/bin/zero_fit --world 8 --gb 80 --seq 4096 --micro 1 --ema 0.999
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "models/registry.h"
#include "run/config/config.h"
#include "trainer/parallel/memory_check.h"

namespace {

struct Shape {
  const char* name;
  int64_t d, layers, heads, kv_heads = 0;
  double ffn_mult = 0;        // llama: model.ffn_dim_multiplier
  int64_t ffn_multiple = 256, vocab = 50304;
  bool tied = false;          // llama: model.tie_embeddings
};

// GPT-3's table (Brown et al., 2020, GPT-2's 50257-token vocabulary padded); Llama 3.2 1B and 3B,
// Llama 2 13B, Llama 3 8B, 70B and 405B as published (their FFN widths and vocabularies).
const std::vector<Shape> kGpt = {{"gpt 350M", 1024, 24, 16}, {"gpt 760M", 1536, 24, 16}, {"gpt 1.3B", 2048, 24, 32},
                                 {"gpt 2.7B", 2560, 32, 32}, {"gpt 6.7B", 4096, 32, 32}, {"gpt 13B", 5120, 40, 40},
                                 {"gpt 30B", 7168, 48, 56},  {"gpt 66B", 9216, 64, 72},  {"gpt 175B", 12288, 96, 96}};
const std::vector<Shape> kLlama = {{"llama 3.2 1B", 2048, 16, 32, 8, 1.5, 256, 128256, true},
                                   {"llama 3.2 3B", 3072, 28, 24, 8, 1.0, 256, 128256, true},
                                   {"llama 3 8B", 4096, 32, 32, 8, 1.3, 1024, 128256},
                                   {"llama 2 13B", 5120, 40, 40, 40, 0, 256, 32000},
                                   {"llama 3 70B", 8192, 80, 64, 8, 1.3, 4096, 128256},
                                   {"llama 3 405B", 16384, 126, 128, 8, 1.2, 4096, 128256}};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"zero_fit: the largest GPT / Llama each ZeRO stage fits, from the memory check's formula"};
  int world = 8;
  double gb = 80, ema = 0;
  int64_t seq = 2048, micro = 1;
  app.add_option("--world", world, "ranks (GPUs)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--gb", gb, "GB (1e9 bytes) per GPU the estimate may use")->check(CLI::PositiveNumber);
  app.add_option("--seq", seq, "model.seq_len")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--micro", micro, "train.micro_batch_size")->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--ema", ema, "train.ema_decay (0: no EMA)")->check(CLI::Range(0.0, 0.999999));
  CLI11_PARSE(app, argc, argv);
  const std::string src = LM_SOURCE_DIR;
  std::printf("zero_fit: %d ranks x %.0f GB, micro-batch %lld x %lld, train.dtype=bf16, fused loss, EMA %s; "
              "per-rank estimate (GB): weights + gradients/optimizer/EMA + activations\n\n",
              world, gb, (long long)micro, (long long)seq, ema > 0 ? "on" : "off");
  std::printf("| model | params | act. ckpt | %s |\n|---|---|---|---|---|---|---|\n",
              "dist.zero 0 | dist.zero 1 | dist.zero 2 | dist.zero 3");
  for (const auto* ladder : {&kGpt, &kLlama}) {
    const bool llama = ladder == &kLlama;
    for (const char* ckpt : {"none", "block"}) {
      std::string largest[4];
      for (const Shape& s : *ladder) {
        const int64_t vocab = s.vocab;
        std::vector<std::string> o = {
            "model.d_model=" + std::to_string(s.d), "model.n_layer=" + std::to_string(s.layers),
            "model.n_head=" + std::to_string(s.heads), "model.seq_len=" + std::to_string(seq),
            "train.micro_batch_size=" + std::to_string(micro), "train.dtype=bf16", "train.fused_loss=on",
            std::string("train.activation_checkpointing=") + ckpt, "train.ema_decay=" + std::to_string(ema),
            "checkpoint.async=false", "model.dropout=0", "model.vocab_size=" + std::to_string(vocab)};
        if (llama) {
          o.push_back("model.n_kv_head=" + std::to_string(s.kv_heads));
          o.push_back("model.ffn_multiple_of=" + std::to_string(s.ffn_multiple));
          o.push_back("model.ffn_dim_multiplier=" + std::to_string(s.ffn_mult));
          o.push_back(std::string("model.tie_embeddings=") + (s.tied ? "true" : "false"));
        }
        const auto base = lm::load_config(src + (llama ? "/configs/llama-tiny.yaml" : "/configs/tiny.yaml"), o);
        std::string row;
        double params = 0;
        for (int zero = 0; zero < 4; ++zero) {
          auto cfg = base;
          cfg.dist.zero = zero;
          const auto e = lm::estimate_memory(cfg, vocab, /*cuda=*/true, world);
          params = e.params / 4 * (zero == 3 ? world : 1);
          const double total = e.params + e.optimizer + e.activations;  // staging: host memory on CUDA
          const bool fits = total <= gb * 1e9;
          if (fits) largest[zero] = s.name;
          char cell[96];
          std::snprintf(cell, sizeof cell, " %s%.1f = %.1f + %.1f + %.1f%s |", fits ? "" : "~~", total / 1e9,
                        e.params / 1e9, e.optimizer / 1e9, e.activations / 1e9, fits ? "" : "~~");
          row += cell;
        }
        std::printf("| %s | %.2fB | %s |%s\n", s.name, params / 1e9, ckpt, row.c_str());
      }
      std::printf("| **largest %s that fits** | | %s | %s | %s | %s | %s |\n", llama ? "Llama" : "GPT", ckpt,
                  largest[0].empty() ? "none" : largest[0].c_str(), largest[1].empty() ? "none" : largest[1].c_str(),
                  largest[2].empty() ? "none" : largest[2].c_str(), largest[3].empty() ? "none" : largest[3].c_str());
    }
  }
  return 0;
}
