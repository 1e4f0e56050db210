// train.activation_checkpointing=block in real trainer runs against none: the same per-step losses
// and byte-identical final weights, GPT with dropout and gradient accumulation, Llama, bf16
// (LibTorch >= 2.4), and 2 ranks over Gloo (the gradient all-reduces launched from the parameters'
// hooks); the memory estimate and its refusal line. The resume of a checkpointed run is
// ResumeE2E.ActivationCheckpointingDropoutGradAccum (resume_test.cpp).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/torch/compat.h"
#include "models/registry.h"
#include "tests/testutil.h"
#include "run/config/config.h"
#include "trainer/parallel/memory_check.h"

namespace lm {
namespace {

using test::TempDir;

class ActCkptE2E : public ::testing::Test {
 protected:
  const std::string data_ = test::shared_bytes_dataset();
};

std::vector<std::string> ac_args(const std::string& config, const std::string& data, const std::string& run,
                                 const std::vector<std::string>& extra) {
  std::vector<std::string> a = {test::source_path(config), "data.train=" + data, "run.dir=" + run, "log.every_steps=1",
                                "eval.batches=0", "train.threads=1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

std::vector<double> ac_losses(const std::string& run) {
  std::vector<double> out;
  for (auto& l : test::metrics_of_kind(run + "/metrics.jsonl", "train")) out.push_back(nlohmann::json::parse(l)["loss"]);
  return out;
}

// Runs `config` + extra with train.activation_checkpointing none and block on `ranks` processes
// (a Gloo group when 2) and expects `steps` identical losses and identical model.safetensors bytes.
void ac_expect_block_equals_none(const std::string& data, const std::string& config, const std::vector<std::string>& extra,
                                 int steps, int ranks = 1) {
  TempDir none, block;
  for (const auto* dir : {&none, &block}) {
    auto more = extra;
    more.push_back("train.max_steps=" + std::to_string(steps));
    more.push_back(std::string("train.activation_checkpointing=") + (dir == &block ? "block" : "none"));
    const int port = test::free_port();
    std::vector<test::Proc> procs;
    for (int r = 0; r < ranks; ++r) {
      const std::vector<std::string> env = test::rank_env(r, ranks, port);
      procs.push_back(test::spawn_bin("trainer", ac_args(config, data, dir->path(), more), *dir / ("out" + std::to_string(r)), env));
    }
    for (auto& p : procs) ASSERT_EQ(test::wait_proc(p), 0) << test::read_text(p.log);
  }
  const std::string out = test::read_text(block / "out0");
  EXPECT_NE(out.find("activations: each block's input kept, the block run again in the backward "
                     "(train.activation_checkpointing=block)"),
            std::string::npos)
      << out;
  if (ranks > 1) {  // every bucket launched from the parameters' hooks during the backward, none after it
    std::smatch m;
    ASSERT_TRUE(std::regex_search(out, m, std::regex("data parallel: (\\d+) of (\\d+) gradient buckets launched from "
                                                     "the backward's hooks at step 1")))
        << out;
    EXPECT_EQ(m[1].str(), m[2].str()) << m[0].str();
    EXPECT_GT(std::stoi(m[2].str()), 1) << m[0].str();
  }
  const auto a = ac_losses(none.path()), b = ac_losses(block.path());
  ASSERT_EQ(a.size(), static_cast<size_t>(steps));
  EXPECT_EQ(a, b);
  EXPECT_EQ(test::read_text(none / "model.safetensors"), test::read_text(block / "model.safetensors"));
}

TEST_F(ActCkptE2E, GptDropoutGradAccumBlockEqualsNone) {
  ac_expect_block_equals_none(data_, "configs/tiny.yaml", {"model.dropout=0.1", "train.grad_accum=2"}, 8);
}

TEST_F(ActCkptE2E, LlamaBlockEqualsNone) { ac_expect_block_equals_none(data_, "configs/llama-tiny.yaml", {}, 8); }

// The GPU's path on a CPU: bf16 autocast with the bf16 residual stream and the fused head + loss.
TEST_F(ActCkptE2E, Bf16BlockEqualsNone) {
  if (!compat::kHasCpuAutocast)
    GTEST_SKIP() << "LibTorch " << compat::torch_version() << " has no CPU autocast for the trainer (>= 2.4): "
                 << "bash launch/dev/torch2.sh runs this against LibTorch 2.6";
  ac_expect_block_equals_none(data_, "configs/tiny.yaml",
                              {"model.dropout=0.1", "train.dtype=bf16", "train.bf16_residual=true", "train.fused_loss=on"}, 8);
}

// Two ranks over Gloo, several gradient buckets: the all-reduces launched from the parameters'
// AccumulateGrad hooks (trainer/parallel/grad_sync.cpp) as the checkpointed blocks' gradients arrive.
TEST_F(ActCkptE2E, TwoRanksGlooBlockEqualsNone) {
  ac_expect_block_equals_none(data_, "configs/tiny.yaml",
                              {"model.dropout=0.1", "train.micro_batch_size=4", "dist.bucket_mb=0.05", "dist.timeout_s=60"}, 6,
                              2);
}

// data.doc_mask with activation checkpointing: the checkpointed blocks rerun with the same documents'
// mask and positions (GPT and Llama; GPT on two ranks over Gloo).
// Checked to fail with the checkpointed blocks given no documents (GPT's, then Llama's lambda).
TEST_F(ActCkptE2E, DocMaskGptBlockEqualsNone) {
  ac_expect_block_equals_none(data_, "configs/tiny.yaml", {"data.doc_mask=true", "train.grad_accum=2"}, 6);
}
TEST_F(ActCkptE2E, DocMaskLlamaBlockEqualsNone) {
  ac_expect_block_equals_none(data_, "configs/llama-tiny.yaml", {"data.doc_mask=true"}, 6);
}
TEST_F(ActCkptE2E, DocMaskTwoRanksGlooBlockEqualsNone) {
  ac_expect_block_equals_none(data_, "configs/tiny.yaml",
                              {"data.doc_mask=true", "train.micro_batch_size=4", "dist.bucket_mb=0.05", "dist.timeout_s=60"},
                              4, 2);
}

// data.doc_mask changes what the model computes (the windows of the bytes dataset hold several
// documents), and the trainer says so at start. Checked to fail with numerics.doc_eos left unset.
TEST_F(ActCkptE2E, DocMaskChangesTheLossAndIsLogged) {
  TempDir off, on;
  for (const auto* dir : {&off, &on}) {
    auto r = test::run_bin("trainer", ac_args("configs/tiny.yaml", data_, dir->path(),
                                              {"train.max_steps=2", std::string("data.doc_mask=") + (dir == &on ? "true" : "false")}));
    ASSERT_EQ(r.exit_code, 0) << r.out;
    const bool said = r.out.find("documents: attention within each document, positions restarting at each "
                                 "(data.doc_mask; EOS id 256)") != std::string::npos;
    EXPECT_EQ(said, dir == &on) << r.out;
    if (dir == &on) {  // the kernel line says how the documents are kept apart: 1.13's fused CPU kernel, or 2.x's SDPA
      EXPECT_TRUE(r.out.find("one document block at a time") != std::string::npos ||
                  r.out.find("with the documents' boolean mask") != std::string::npos)
          << r.out;
    }
  }
  const auto a = ac_losses(off.path()), b = ac_losses(on.path());
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_NE(a[0], b[0]);
}

// With block, the activations are one (B,T,C) input per layer (the residual stream's dtype) and one
// layer's activations; the refusal line says so.
TEST(MemoryEstimate, BlockCheckpointingKeepsOneInputPerLayerAndOneBlock) {
  for (const char* config : {"configs/gpt2-124m.yaml", "configs/llama-tiny.yaml"})
    for (const char* dtype : {"fp32", "bf16"}) {
      SCOPED_TRACE(std::string(config) + " " + dtype);
      auto cfg = load_config(test::source_path(config), {std::string("train.dtype=") + dtype});
      const double B = static_cast<double>(cfg.train.micro_batch_size), T = static_cast<double>(cfg.model.seq_len);
      const double L = static_cast<double>(cfg.model.n_layer), d = static_cast<double>(cfg.model.d_model);
      const double layer = B * T * saved_activations_per_token_layer(cfg.model) * (cfg.train.bf16() ? 2 : 4);
      const double none = estimate_memory(cfg, 50304).activations;
      cfg.train.activation_checkpointing = "block";
      EXPECT_DOUBLE_EQ(none - estimate_memory(cfg, 50304).activations, L * layer - (L * B * T * d * 4 + layer));
      if (cfg.train.bf16()) {
        cfg.train.bf16_residual = true;  // the inputs in bf16
        EXPECT_DOUBLE_EQ(none - estimate_memory(cfg, 50304).activations, L * layer - (L * B * T * d * 2 + layer));
      }
    }
  auto cfg = load_config(test::source_path("configs/tiny.yaml"),
                         {"model.seq_len=65536", "train.micro_batch_size=1024", "train.activation_checkpointing=block"});
  try {
    check_memory_fits(cfg, 258, torch::Device(torch::kCPU));
    ADD_FAILURE() << "fits";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("GB (train.activation_checkpointing=block: one (B,T,C) input per layer and one "
                                         "block's activations) at train.micro_batch_size=1024"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lm
