// ZeRO-3 (dist.zero: 3, on top of ZeRO-2's gradient pieces) in real Gloo groups of trainer processes: the same per-step losses,
// gradient norms, final weights and EMA as plain data parallelism (dist.zero: 0) at the same world
// size, GPT and Llama, with dropout, clipping, gradient accumulation and activation checkpointing;
// and no rank holding all weights at once during the steps.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <filesystem>
#include <regex>

#include "tests/testutil.h"
#include "tests/trainer/parallel/group_run.h"
#include "trainer/checkpoint/safetensors.h"

namespace lm {
namespace {

using test::TempDir;
using test::loss_and_norm;
namespace fs = std::filesystem;

class Zero3E2E : public ::testing::Test, protected test::GroupRun {
 protected:
  Zero3E2E() {
    common = {"log.every_steps=1", "eval.batches=0", "train.threads=1", "dist.bucket_mb=0.05", "dist.timeout_s=60"};
  }
  // dist.zero 0 and 3 at `world` ranks: every step's loss and norm, the final weights and the
  // checkpoint's EMA, bit for bit.
  void expect_same_as_plain(int world, const std::string& config, std::vector<std::string> extra, int64_t steps) {
    TempDir plain, zero;
    extra.push_back("train.max_steps=" + std::to_string(steps));
    extra.push_back("train.ema_decay=0.9");
    GroupRun::config = config;
    run_ok(plain.path(), world, extra);
    auto z = extra;
    z.push_back("dist.zero=3");
    run_ok(zero.path(), world, z);
    const auto a = loss_and_norm(plain.path()), b = loss_and_norm(zero.path());
    ASSERT_EQ(a.size(), static_cast<size_t>(steps));
    EXPECT_EQ(a, b) << config << " world " << world;
    EXPECT_EQ(test::read_text(plain / "model.safetensors"), test::read_text(zero / "model.safetensors")) << config;
    test::expect_same_ema(plain.path(), zero.path(), steps);
    const std::string log1 = test::read_text(zero / "logs/rank_1.log");
    EXPECT_NE(log1.find("zero-3: rank 1 keeps"), std::string::npos) << log1;
    // The gradients in pieces as ZeRO-2 keeps them (no whole gradient buffer), the norm streamed.
    EXPECT_NE(log1.find("zero-2: rank 1 keeps the summed gradients and"), std::string::npos) << log1;
    EXPECT_NE(log1.find("norm streamed bucket by bucket"), std::string::npos) << log1;
  }
};

// Checked to fail with the gather before a block's backward left out (UnitShards::unit_before_backward
// returning at once): the released weights read as zeros there, the norms differ from step 1.
TEST_F(Zero3E2E, GptTwoRanksDropoutAccumulationClippingSameAsPlain) {
  expect_same_as_plain(2, "configs/tiny.yaml", {"train.micro_batch_size=2", "train.grad_accum=2", "model.dropout=0.1"}, 6);
}

TEST_F(Zero3E2E, GptFourRanksActivationCheckpointingSameAsPlain) {
  expect_same_as_plain(4, "configs/tiny.yaml",
                       {"train.micro_batch_size=2", "model.dropout=0.1", "train.activation_checkpointing=block"}, 5);
}

// Llama with grouped-query attention and an untied head (its own unit's weight).
TEST_F(Zero3E2E, LlamaUntiedActivationCheckpointingAccumulationSameAsPlain) {
  expect_same_as_plain(2, "configs/llama-tiny.yaml",
                       {"train.micro_batch_size=2", "train.grad_accum=2", "model.tie_embeddings=false",
                        "train.activation_checkpointing=block"},
                       5);
  expect_same_as_plain(4, "configs/llama-tiny.yaml", {"train.micro_batch_size=2", "model.tie_embeddings=false"}, 4);
}

// No rank holds all weights, during the steps nor while saving: the values gathered at once (the
// rest and at most the blocks around the one running) stay below the model's, and so do the bytes
// the weights' storages hold (its packed pieces and every unit storage holding memory, read from
// the storages after every gather), with checkpoints of every step (with the EMA) and the final
// weights written (nothing can make the weights whole on a rank: the strategy has no such call).
// Checked to fail with the units' storages never handed back (no release_storage in
// UnitShards::release): every unit held at once, more than the model's bytes with the pieces.
TEST_F(Zero3E2E, NoRankEverHoldsAllWeightsDuringTheStepsOrTheSaves) {
  TempDir zero;
  run_ok(zero.path(), 2,
         {"train.max_steps=3", "train.micro_batch_size=2", "model.n_layer=8", "dist.zero=3", "dist.bucket_mb=0.2",
          "checkpoint.every_steps=1", "train.ema_decay=0.9"});
  EXPECT_TRUE(fs::exists(zero / "model.safetensors"));
  EXPECT_TRUE(fs::exists(zero / "checkpoints/step_00000003/model.part_1.safetensors"));
  for (int r = 0; r < 2; ++r) {
    const std::string log = test::read_text(zero / ("logs/rank_" + std::to_string(r) + ".log"));
    const std::regex line("zero-3: at most (\\d+) of (\\d+) weight values gathered at once \\((\\d+) bytes of (\\d+)\\) by "
                          "step \\d+; at most (\\d+) bytes held by the weights' storages");
    long long gathered = -1, total = 0, resident = -1;
    for (std::sregex_iterator it(log.begin(), log.end(), line), end; it != end; ++it) {
      gathered = std::max(gathered, std::stoll((*it)[1].str()));
      total = std::stoll((*it)[2].str());
      resident = std::max(resident, std::stoll((*it)[5].str()));
    }
    ASSERT_GE(gathered, 0) << log;
    EXPECT_GT(gathered, 0);
    EXPECT_LT(gathered, total * 6 / 10) << "rank " << r;     // the rest and about 3 of 8 blocks
    EXPECT_LT(resident, total * 4 * 9 / 10) << "rank " << r;  // half owned, plus the gathered units' other half
    EXPECT_GT(resident, total * 4 / 2 * 9 / 10) << "rank " << r;  // its own half is always there
  }
}

// Each rank's "memory: start-up peak X MB" (the process's peak resident set when training begins).
std::vector<double> startup_peaks_mb(const std::string& dir, int world) {
  std::vector<double> out;
  for (int r = 0; r < world; ++r) {
    const std::string log = test::read_text(dir + "/logs/rank_" + std::to_string(r) + ".log");
    std::smatch m;
    EXPECT_TRUE(std::regex_search(log, m, std::regex("memory: start-up peak (\\d+) MB \\(peak resident set\\)"))) << log;
    out.push_back(m.empty() ? 0 : std::stod(m[1].str()));
  }
  return out;
}

// No rank holds all weights at the start either, nor when it resumes: the model is built with
// placeholders and each rank draws (or reads from its checkpoint) only its own pieces. A model whose
// weights dominate (d_model 512, 8 layers: 25M weights, 102 MB) at 4 ranks, ZeRO-3 against ZeRO-2
// (which keeps every weight, but the same gradient pieces and optimizer state): each ZeRO-3 rank's
// start-up peak is below every ZeRO-2 rank's by more than half the weights' bytes (3/4 expected:
// 75 MB here), fresh and resumed from the same checkpoint in parts (ZeRO-3's, 4 ranks); and a
// ZeRO-3 resume from ZeRO-2's checkpoint, whose weights file is whole, peaks within half the
// weights of the resume from parts (the file read one tensor at a time). Checked to fail with the
// model built whole as before (build_model, every value copied into the flat buffer): the ZeRO-3
// ranks peaked at 539 MB against ZeRO-2's 440; with a resume reading every piece of the weights
// (ModuleState::load_state without the rank's part): 418 MB against ZeRO-2's 418; and with the
// checkpoint reader loading whole files at once as before: 442 MB against 343 from parts.
TEST_F(Zero3E2E, NoRankHoldsAllWeightsAtTheStartNorWhenItResumes) {
  TempDir two, three;
  const std::vector<std::string> shape = {"model.d_model=512", "model.n_layer=8", "model.n_head=8", "model.seq_len=32",
                                          "train.micro_batch_size=1", "dist.bucket_mb=4", "checkpoint.every_steps=1"};
  auto leg = [&](const std::string& dir, int zero, int64_t steps, const std::string& resume) {
    auto a = shape;
    a.push_back("dist.zero=" + std::to_string(zero));
    a.push_back("train.max_steps=" + std::to_string(steps));
    if (!resume.empty()) a.push_back("checkpoint.resume=" + resume);
    run_ok(dir, 4, a);
  };
  leg(two / "a", 2, 1, "");
  leg(three / "a", 3, 1, "");
  leg(two / "b", 2, 2, test::checkpoint_dir(three / "a", 1));  // the same parts read
  leg(three / "b", 3, 2, test::checkpoint_dir(three / "a", 1));
  leg(three / "c", 3, 2, test::checkpoint_dir(two / "a", 1));  // ZeRO-2's checkpoint: the weights whole
  const std::string log = test::read_text(three / "a/logs/rank_0.log");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(log, m, std::regex("the weights are (\\d+) MB"))) << log;
  const double weights_mb = std::stod(m[1].str());
  EXPECT_GT(weights_mb, 90);
  for (const char* sub : {"a", "b"}) {
    const auto p2 = startup_peaks_mb(two / sub, 4), p3 = startup_peaks_mb(three / sub, 4);
    const double low2 = *std::min_element(p2.begin(), p2.end()), high3 = *std::max_element(p3.begin(), p3.end());
    EXPECT_LT(high3, low2 - weights_mb / 2) << sub << ": ZeRO-3 " << testing::PrintToString(p3) << " MB, ZeRO-2 "
                                            << testing::PrintToString(p2) << " MB, weights " << weights_mb << " MB";
    std::printf("%s: start-up peaks ZeRO-2 %s MB, ZeRO-3 %s MB (weights %.0f MB)\n", sub, testing::PrintToString(p2).c_str(),
                testing::PrintToString(p3).c_str(), weights_mb);
  }
  EXPECT_EQ(loss_and_norm(two / "b"), loss_and_norm(three / "b"));
  // From a checkpoint holding the weights whole, a rank reads them one tensor at a time and copies
  // in its pieces: about the peak of the resume from parts.
  const auto pb = startup_peaks_mb(three / "b", 4), pc = startup_peaks_mb(three / "c", 4);
  const double high_c = *std::max_element(pc.begin(), pc.end()), low_b = *std::min_element(pb.begin(), pb.end());
  EXPECT_LT(high_c, low_b + weights_mb / 2) << "ZeRO-3 from a whole checkpoint " << testing::PrintToString(pc)
                                            << " MB, from parts " << testing::PrintToString(pb) << " MB";
  std::printf("c: start-up peaks of ZeRO-3 resumed from ZeRO-2's whole checkpoint %s MB\n", testing::PrintToString(pc).c_str());
  EXPECT_EQ(loss_and_norm(two / "b"), loss_and_norm(three / "c"));
}

// Evaluation gathers the weights unit by unit inside the validation and task forwards, as the steps
// do (an odd number of batches over 2 ranks, and task examples whose choices make 5 forwards on rank
// 0 and 2 on rank 1: the ranks in lockstep), the EMA's pieces swapped in: the same validation losses
// of the weights and of the EMA, and the same task scores, as plain data parallelism, bit for bit.
// Checked to fail with UnitShards::replaced() doing nothing:
// the EMA's loss read the rest unit still gathered from the trained weights and differed; and with
// the tasks' lockstep forwards left out (score_choice_rows' `forwards` ignored): rank 0 waits for
// gathers rank 1 never joins, and the group times out.
TEST_F(Zero3E2E, EvaluationGathersUnitByUnitAndGivesThePlainLosses) {
  TempDir plain, zero, tasks;
  std::string task;
  const std::vector<int> choices = {3, 2, 4, 2, 3};  // examples 0, 2, 4 on rank 0 (10 rows), 1, 3 on rank 1 (4)
  for (size_t i = 0; i < choices.size(); ++i) {
    nlohmann::json ch = nlohmann::json::array();
    for (int k = 0; k < choices[i]; ++k) ch.push_back(std::string(" and the ") + "abcdef"[k + static_cast<int>(i)] + " word");
    task += nlohmann::json({{"context", "In the beginning " + std::to_string(i)}, {"choices", ch}, {"label", 1}}).dump() + "\n";
  }
  test::write_text(tasks / "t.jsonl", task);
  const std::vector<std::string> a = {"train.max_steps=4", "train.micro_batch_size=2", "train.ema_decay=0.9",
                                      "eval.batches=3", "eval.every_steps=2",
                                      "eval.tasks=[{name: t, path: " + tasks / "t.jsonl" + "}]"};
  run_ok(plain.path(), 2, a);
  auto z = a;
  z.push_back("dist.zero=3");
  run_ok(zero.path(), 2, z);
  auto val = [](const std::string& dir) {
    std::vector<std::string> out;
    for (auto& l : test::metrics_of_kind(dir + "/metrics.jsonl", "val")) {
      const auto j = nlohmann::json::parse(l);
      out.push_back(j["step"].dump() + " " + j["val_loss"].dump() + " " + j["val_loss_ema"].dump());
    }
    return out;
  };
  const auto vp = val(plain.path()), vz = val(zero.path());
  ASSERT_EQ(vp.size(), 2u);
  EXPECT_EQ(vp, vz);
  auto scores = [](const std::string& dir) {
    std::vector<std::string> out;
    for (auto& l : test::metrics_of_kind(dir + "/metrics.jsonl", "task")) {
      const auto j = nlohmann::json::parse(l);
      out.push_back(j["step"].dump() + " " + j["task_acc"].dump() + " " + j["task_acc_norm"].dump());
    }
    return out;
  };
  ASSERT_EQ(scores(plain.path()).size(), 3u);  // steps 0, 2, 4
  EXPECT_EQ(scores(plain.path()), scores(zero.path()));
  EXPECT_EQ(loss_and_norm(plain.path()), loss_and_norm(zero.path()));
}

// export and generate read a ZeRO-3 checkpoint's model parts, put together parameter by parameter:
// the export of the last checkpoint (parts) is byte for byte the export of the final weights (the
// same step), and generate from it writes the same text. A part missing is refused naming it.
// Checked to fail with WeightsReader putting a parameter's slices together in reverse order: both
// the exports and the generated texts differ.
TEST_F(Zero3E2E, ExportAndGenerateReadACheckpointsPartsTensorByTensor) {
  TempDir z, out;
  run_ok(z.path(), 2, {"train.max_steps=4", "train.micro_batch_size=2", "dist.zero=3", "checkpoint.every_steps=2"});
  const std::string ckpt = test::checkpoint_dir(z.path(), 4);
  ASSERT_TRUE(fs::exists(ckpt + "/model.part_1.safetensors"));
  ASSERT_FALSE(fs::exists(ckpt + "/model.safetensors"));
  auto from_parts = test::run_bin("export", {"--run", z.path(), "--format", "hf", "--weights", ckpt, out / "a"});
  ASSERT_EQ(from_parts.exit_code, 0) << from_parts.out;
  EXPECT_NE(from_parts.out.find("tensors streamed"), std::string::npos) << from_parts.out;
  auto from_file = test::run_bin("export", {"--run", z.path(), "--format", "hf", out / "b"});
  ASSERT_EQ(from_file.exit_code, 0) << from_file.out;
  EXPECT_TRUE(test::read_text(out / "a/model.safetensors") == test::read_text(out / "b/model.safetensors"));
  const std::vector<std::string> gen = {"--run", z.path(), "--tokens", "8", "--prompt", "In the"};
  auto g1 = gen, g2 = gen;
  g1.insert(g1.end(), {"--weights", ckpt});
  auto a = test::run_bin("generate", g1), b = test::run_bin("generate", g2);
  ASSERT_EQ(a.exit_code, 0) << a.out;
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_EQ(a.out, b.out);
  // A damaged checkpoint: refused in one line naming it, exit 2.
  fs::remove(ckpt + "/model.part_1.safetensors");
  auto bad = test::run_bin("export", {"--run", z.path(), "--format", "hf", "--weights", ckpt, out / "c"});
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find(ckpt), std::string::npos) << bad.out;
}

// The values each rank's part of a checkpoint component holds ("model", "ema": ZeRO-3 saves its pieces).
std::vector<int64_t> part_numels(const std::string& ckpt, const std::string& key, int world) {
  std::vector<int64_t> out;
  for (int r = 0; r < world; ++r) {
    int64_t n = 0;
    for (auto& [name, t] : load_safetensors(ckpt + "/" + key + ".part_" + std::to_string(r) + ".safetensors")) n += t.numel();
    out.push_back(n);
  }
  return out;
}

// A dist.zero 3 checkpoint is each rank's pieces of the weights, the EMA and the moments, one part
// per rank, and any run resumes it: 3 at 4 ranks -> 0 at 1 rank -> 2 at 2 ranks -> 3 at 2 ranks,
// every leg bit for bit the same chain of plain data parallelism (losses, norms, final weights, EMA).
// Checked to fail with each slice's values read back reversed (copy_flat_slice): leg 1's losses differ.
TEST_F(Zero3E2E, CheckpointsInPartsResumeAcrossStagesAndWorldSizes) {
  TempDir p, z;
  struct Leg {
    int world;
    int64_t zero, micro, steps;
  };
  const std::vector<Leg> chain = {{4, 3, 2, 4}, {1, 0, 8, 6}, {2, 2, 4, 8}, {2, 3, 4, 10}};
  std::string prev_p, prev_z;
  for (size_t i = 0; i < chain.size(); ++i) {
    const auto& leg = chain[i];
    const std::string dp = p / ("leg" + std::to_string(i)), dz = z / ("leg" + std::to_string(i));
    const std::vector<std::string> a = {"train.micro_batch_size=" + std::to_string(leg.micro),
                                        "train.max_steps=" + std::to_string(leg.steps), "checkpoint.every_steps=2",
                                        "model.dropout=0.0", "train.ema_decay=0.9"};
    auto ap = a, az = a;
    if (!prev_p.empty()) ap.push_back("checkpoint.resume=" + prev_p), az.push_back("checkpoint.resume=" + prev_z);
    az.push_back("dist.zero=" + std::to_string(leg.zero));
    run_ok(dp, leg.world, ap);
    run_ok(dz, leg.world, az);
    EXPECT_EQ(loss_and_norm(dp), loss_and_norm(dz)) << "leg " << i;
    EXPECT_TRUE(test::read_text(dp + "/model.safetensors") == test::read_text(dz + "/model.safetensors")) << "leg " << i;
    test::expect_same_ema(dp, dz, leg.steps);
    prev_p = test::checkpoint_dir(dp, leg.steps), prev_z = test::checkpoint_dir(dz, leg.steps);
    const auto mp = test::checkpoint_component(prev_p, "model"), mz = test::checkpoint_component(prev_z, "model");
    ASSERT_EQ(mp.size(), mz.size());
    for (const auto& [name, t] : mp) EXPECT_TRUE(torch::equal(t, mz.at(name))) << name << ", leg " << i;
    EXPECT_EQ(fs::exists(prev_z + "/model.part_0.safetensors"), leg.zero == 3) << prev_z;
    EXPECT_EQ(fs::exists(prev_z + "/model.safetensors"), leg.zero != 3) << prev_z;
    if (leg.zero != 3) continue;
    // Each rank saved what it keeps: the values its start-up line says, no more.
    const auto model = part_numels(prev_z, "model", leg.world), ema = part_numels(prev_z, "ema", leg.world);
    int64_t total = 0, weights = -1;
    for (int r = 0; r < leg.world; ++r) {
      const std::string log = test::read_text(dz + "/logs/rank_" + std::to_string(r) + ".log");
      std::smatch m;
      ASSERT_TRUE(std::regex_search(log, m, std::regex("zero-3: rank \\d+ keeps (\\d+) of (\\d+) weights"))) << log;
      EXPECT_EQ(model[r], std::stoll(m[1].str())) << "rank " << r << ", leg " << i;
      EXPECT_EQ(ema[r], model[r]) << "rank " << r << ", leg " << i;
      EXPECT_LT(model[r], std::stoll(m[2].str()) / leg.world * 11 / 10) << "rank " << r;
      total += model[r];
      weights = std::stoll(m[2].str());
    }
    EXPECT_EQ(total, weights) << "leg " << i;
  }
}

}  // namespace
}  // namespace lm
