// Data mixtures through the real trainer and data-inspect processes: bad mixtures exit 2 with one
// line; a 2-source run with a stage change records its realised tokens per source (metrics.jsonl,
// meta.json), resumes with edited weights, and refuses a removed source at resume unless forced.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>

#include "common/checksum.h"
#include "common/files.h"
#include "data/format/manifest.h"
#include "tests/testutil.h"
#include "tests/trainer/dataset_copy.h"

namespace lm {
namespace {

using test::TempDir;

void expect_one_line_exit_2(const test::RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

std::vector<std::string> mix_args(const std::string& run, const std::string& sources, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=", "data.sources=" + sources,
                                "run.dir=" + run, "train.max_steps=12", "log.every_steps=2", "eval.batches=0",
                                "checkpoint.every_steps=6", "train.threads=1", "model.seq_len=32",
                                "train.micro_batch_size=4"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

TEST(MixRunTest, BadMixturesExit2WithOneLine) {
  TempDir tmp;
  const std::string data = test::shared_bytes_dataset(), other = test::other_tokenizer_copy(data, tmp / "other");
  const std::string two = "[{name: a, path: " + data + "}, {name: b, path: " + other + "}]";
  expect_one_line_exit_2(test::run_bin("trainer", mix_args(tmp / "r1", two)), "source 'b'");
  expect_one_line_exit_2(test::run_bin("trainer", mix_args(tmp / "r2", "[{name: a, path: " + tmp / "missing" + "}]")),
                         tmp / "missing");
  const std::string ok = "[{name: a, path: " + data + "}, {name: b, path: " + data + ", weight: 2}]";
  expect_one_line_exit_2(test::run_bin("trainer", mix_args(tmp / "r3", ok, {"data.stages=[{until: 5, weights: {c: 1}}]"})),
                         "stage 1 names unknown source 'c'");
  expect_one_line_exit_2(test::run_bin("trainer", mix_args(tmp / "r4", "[{name: a, path: " + data + ", weight: 0}]")),
                         "source 'a': weight must be > 0");
  expect_one_line_exit_2(test::run_bin("trainer", mix_args(tmp / "r5", "[{name: a, path: " + data + ", wieght: 1}]")),
                         "unknown key 'wieght'");
}

TEST(MixRunTest, RecordsResumesEditedAndRefusesRemovedSource) {
  TempDir tmp;
  const std::string data = test::shared_bytes_dataset(), run = tmp / "run";
  const std::string two = "[{name: a, path: " + data + ", weight: 1}, {name: b, path: " + data + ", weight: 3}]";
  const std::string stages = "data.stages=[{until: 4, weights: {a: 1}}, {weights: {a: 1, b: 1}}]";
  auto r = test::run_bin("trainer", mix_args(run, two, {stages, "train.max_steps=6"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto recs = test::metrics_of_kind(run + "/metrics.jsonl", "train");
  ASSERT_EQ(recs.size(), 3u);
  const int64_t per_step = 4 * 32;
  for (size_t i = 0; i < recs.size(); ++i) {
    auto j = nlohmann::json::parse(recs[i]);
    const int64_t a = j["source_tokens"]["a"], b = j["source_tokens"]["b"];
    EXPECT_EQ(a + b, 2 * per_step);
    if (i < 2) {
      EXPECT_EQ(b, 0) << "stage 1 reads a only";
    } else {
      EXPECT_EQ(a, b) << "stage 2: half and half";
    }
  }
  auto meta = nlohmann::json::parse(test::read_text(run + "/meta.json"));
  EXPECT_EQ(meta["data"]["mixture"]["sources"].size(), 2u) << meta.dump();
  EXPECT_EQ(meta["data"]["mixture"]["stages"].size(), 2u);
  EXPECT_EQ(meta["data"]["data_version"], meta["data"]["mixture"]["data_version"]);
  // Resume with edited weights (stages dropped): the new mixture from step 6 on; totals carry on.
  r = test::run_bin("trainer", mix_args(run, "[{name: a, path: " + data + ", weight: 3}, {name: b, path: " + data + ", weight: 1}]",
                                    {"train.max_steps=10"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("the mixture changed at resume"), std::string::npos) << r.out;
  recs = test::metrics_of_kind(run + "/metrics.jsonl", "train");
  auto last = nlohmann::json::parse(recs.back());
  EXPECT_EQ(last["step"], 10);
  EXPECT_EQ(last["source_tokens"]["a"].get<int64_t>(), 3 * last["source_tokens"]["b"].get<int64_t>());
  EXPECT_EQ(last["source_tokens_total"]["a"].get<int64_t>() + last["source_tokens_total"]["b"].get<int64_t>(),
            10 * per_step);
  // report: the stacked chart of the realised mixture against the target.
  r = test::run_bin("report", {run, "-o", tmp / "report.html"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string html = test::read_text(tmp / "report.html");
  EXPECT_NE(html.find("data-chart=\"mixture-0\""), std::string::npos);
  EXPECT_NE(html.find("target: a"), std::string::npos);
  // Removing source b, which was read: refused with one line naming it; checkpoint.force continues.
  const std::string only_a = "[{name: a, path: " + data + "}]";
  // (Found while restoring, after the start-up log: the error is the output's last line.)
  r = test::run_bin("trainer", mix_args(run, only_a, {"train.max_steps=12"}));
  EXPECT_EQ(r.exit_code, 2) << r.out;
  const auto tail = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
  EXPECT_NE(tail.find("source 'b' was read"), std::string::npos) << r.out;
  r = test::run_bin("trainer", mix_args(run, only_a, {"train.max_steps=12", "checkpoint.force=true"}));
  EXPECT_EQ(r.exit_code, 0) << r.out;
  // data-inspect: batch 7 (step 7) of the edited config; the planned mixture per stage.
  r = test::run_bin("data-inspect", {"--config", test::source_path("configs/tiny.yaml"), "--set", "data.train=", "--set",
                                     "data.sources=" + two, "--set", stages, "--set", "model.seq_len=32", "--set",
                                     "train.micro_batch_size=4", "--batch", "1", "--world-size", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["mixture"]["stages"][0]["weights"]["a"], 1.0);
  EXPECT_EQ(j["mixture"]["stages"][1]["weights"]["b"], 0.5);
  EXPECT_EQ(j["batch"]["ranks"].size(), 2u);
  EXPECT_EQ(j["batch"]["ranks"][0]["rows"].size(), 4u);
  EXPECT_EQ(j["batch"]["ranks"][1]["rows"][0]["source"], "a");
}

// train records' source_tokens by step (log.every_steps=1).
std::map<int64_t, std::pair<int64_t, int64_t>> tokens_by_step(const std::string& run) {
  std::map<int64_t, std::pair<int64_t, int64_t>> m;
  for (auto& l : test::metrics_of_kind(run + "/metrics.jsonl", "train")) {
    auto j = nlohmann::json::parse(l);
    m[j["step"].get<int64_t>()] = {j["source_tokens"]["a"].get<int64_t>(), j["source_tokens"]["b"].get<int64_t>()};
  }
  return m;
}

// A stage that ends by until_tokens switches at the batch whose tokens before it reach the count
// (128 target tokens per step: until_tokens 384 = steps 1-3); stages edited at a resume apply from the
// resumed batch (docs/data.md, "What may change at a resume"): the edited first stage, until step 8, reads
// b alone at steps 7-8, the edited last stage a alone from step 9.
TEST(MixRunTest, StageEndsByTokensAndEditedStagesApplyFromTheResumedBatch) {
  TempDir tmp;
  const std::string data = test::shared_bytes_dataset(), run = tmp / "run";
  const std::string two = "[{name: a, path: " + data + "}, {name: b, path: " + data + "}]";
  auto r = test::run_bin("trainer", mix_args(run, two, {"data.stages=[{until_tokens: 384, weights: {a: 1}}, {weights: {a: 1, b: 1}}]",
                                                        "train.max_steps=6", "log.every_steps=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto m = tokens_by_step(run);
  ASSERT_EQ(m.size(), 6u);
  for (int64_t step = 1; step <= 6; ++step) {
    const auto want = step <= 3 ? std::make_pair<int64_t, int64_t>(128, 0) : std::make_pair<int64_t, int64_t>(64, 64);
    EXPECT_EQ(m[step], want) << "step " << step << (step <= 3 ? ": stage 1 (384 tokens), a alone" : ": stage 2");
  }
  EXPECT_NE(r.out.find("data: mixture from batch 3 (stage 2)"), std::string::npos) << r.out;
  r = test::run_bin("trainer", mix_args(run, two, {"data.stages=[{until: 8, weights: {b: 1}}, {weights: {a: 1}}]",
                                                   "train.max_steps=10", "log.every_steps=1"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("the mixture changed at resume"), std::string::npos) << r.out;
  m = tokens_by_step(run);
  ASSERT_EQ(m.size(), 10u);
  for (int64_t step = 7; step <= 10; ++step) {
    const auto want = step <= 8 ? std::make_pair<int64_t, int64_t>(0, 128) : std::make_pair<int64_t, int64_t>(128, 0);
    EXPECT_EQ(m[step], want) << "step " << step << (step <= 8 ? ": the edited stage 1, b alone" : ": the edited stage 2, a alone");
  }
}

// schedule.kind wsd with an anneal stage: the stage's first step (step 5, batch 4) is the decay's
// first step, its lr still optim.lr (progress 0), then linear to the floor at max_steps; b's tokens
// start at the same step. Resumed from the step-4 checkpoint with a later max_steps and the stage
// moved (continual pretraining): allowed, logged, meta.json says what moved, the steps where the old
// run decayed run stable. Resumed from inside the decay with another move: exit 2, one line.
// Checked to fail with the anneal stage's start off by one, and with the resume refusal removed.
TEST(MixRunTest, AnnealStageStartsTheWsdDecayAndAResumeMovesIt) {
  TempDir tmp;
  const std::string data = test::shared_bytes_dataset(), run = tmp / "run", run2 = tmp / "run2";
  const std::string two = "[{name: a, path: " + data + "}, {name: b, path: " + data + "}]";
  auto args = [&](const std::string& dir, int64_t until, int64_t max_steps, std::vector<std::string> extra = {}) {
    extra.insert(extra.begin(), {"data.stages=[{until: " + std::to_string(until) + ", weights: {a: 1}}, {weights: {a: 1, "
                                 "b: 1}, anneal: true}]", "schedule.kind=wsd", "schedule.warmup_steps=2",
                                 "train.max_steps=" + std::to_string(max_steps), "log.every_steps=1",
                                 "checkpoint.every_steps=4"});
    return mix_args(dir, two, extra);
  };
  auto lr_by_step = [](const std::string& dir) {
    std::map<int64_t, double> m;
    for (auto& l : test::metrics_of_kind(dir + "/metrics.jsonl", "train")) {
      auto j = nlohmann::json::parse(l);
      m[j["step"].get<int64_t>()] = j["lr"].get<double>();
    }
    return m;
  };
  auto r = test::run_bin("trainer", args(run, 4, 8));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto meta = nlohmann::json::parse(test::read_text(run + "/meta.json"));
  const double peak = meta["config"]["optim"]["lr"], floor = peak * meta["config"]["schedule"]["min_lr_ratio"].get<double>();
  EXPECT_EQ(meta["schedule"]["decay_start"], 4) << meta["schedule"].dump();
  EXPECT_EQ(meta["schedule"]["decay_end"], 8);
  EXPECT_EQ(meta["data"]["mixture"]["stages"][1]["anneal"], true);
  auto lr = lr_by_step(run);
  ASSERT_EQ(lr.size(), 8u);
  // record n: the lr of step n - 1 (0-based); p = (n - 1 - 4) / 4 in the decay
  const std::map<int64_t, double> want = {{1, peak / 2}, {2, peak}, {3, peak}, {4, peak}, {5, peak},
                                          {6, floor + (peak - floor) * 0.75}, {7, floor + (peak - floor) * 0.5},
                                          {8, floor + (peak - floor) * 0.25}};
  for (const auto& [step, v] : want) EXPECT_NEAR(lr[step], v, 1e-12 * peak) << "step " << step;
  const auto m = tokens_by_step(run);
  EXPECT_EQ(m.at(4).second, 0) << "stage 1: a alone";
  EXPECT_GT(m.at(5).second, 0) << "the anneal stage's first step";

  // Continual pretraining: from the stable step-4 checkpoint, a decay at steps 8-12.
  r = test::run_bin("trainer", args(run2, 8, 12, {"checkpoint.resume=" + run + "/checkpoints/step_00000004"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("schedule: wsd's decay moved at resume from step 4: steps 4-8 -> 8-12"), std::string::npos) << r.out;
  meta = nlohmann::json::parse(test::read_text(run2 + "/meta.json"));
  EXPECT_EQ(meta["schedule"]["decay_start"], 8) << meta["schedule"].dump();
  EXPECT_EQ(meta["schedule"]["decay_moved"],
            nlohmann::json({{"resumed_at_step", 4}, {"was_decay_start", 4}, {"was_decay_end", 8}}));
  lr = lr_by_step(run2);
  for (int64_t step = 5; step <= 9; ++step) EXPECT_NEAR(lr[step], peak, 1e-12 * peak) << "step " << step;
  EXPECT_NEAR(lr[11], floor + (peak - floor) * 0.5, 1e-12 * peak);
  // From inside that decay (the step-12 checkpoint), moved again: refused, the lr would jump.
  expect_one_line_exit_2(test::run_bin("trainer", args(run2, 12, 16)),
                         "steps 8-12 -> 12-16, but step 12 is past the start of the old decay");
}

}  // namespace
}  // namespace lm
