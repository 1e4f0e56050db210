// End to end with the real binaries: prep -> trainer -> generate, and CLI errors exiting 2.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <regex>

#include "tests/testutil.h"

namespace lm {
namespace {

using test::read_text;
using test::run_bin;
using test::TempDir;

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

class TrainE2E : public ::testing::Test {
 protected:
  static std::string data() { return test::shared_bytes_dataset(); }
};

TEST_F(TrainE2E, TinyConfigLossDropsAndRunDirIsComplete) {
  TempDir run;
  auto r = run_bin("trainer", {test::source_path("configs/tiny.yaml"), "data.train=" + data(),
                               "run.dir=" + run.path(), "train.max_steps=80", "log.every_steps=10",
                               "eval.every_steps=40", "eval.batches=2", "train.threads=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto recs = read_jsonl(run / "metrics.jsonl");
  std::vector<nlohmann::json> train, val;
  for (auto& j : recs) {
    if (j["kind"] == "train") train.push_back(j);
    if (j["kind"] == "val") val.push_back(j);
  }
  ASSERT_EQ(train.size(), 8u);
  ASSERT_EQ(val.size(), 2u);  // step 40 and the end
  for (auto& j : train)
    for (auto key : {"step", "loss", "lr", "grad_norm", "tokens_per_s", "step_ms"})
      EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(train.back()["step"], 80);
  double first = train.front()["loss"], last = train.back()["loss"];
  EXPECT_LT(last, first - 1.0) << "loss did not drop: " << first << " -> " << last;
  EXPECT_LT(val.back()["val_loss"].get<double>(), val.front()["val_loss"].get<double>() + 0.05);
  EXPECT_TRUE(std::ifstream(run / "config.yaml").good());
  EXPECT_TRUE(std::ifstream(run / "model.safetensors").good());
  EXPECT_TRUE(std::ifstream(run / "logs/rank_0.log").good());
  EXPECT_NE(r.out.find("resolved config"), std::string::npos);

  // The trained model generates text from the run directory alone (+ its data for the tokenizer).
  auto g = run_bin("generate", {"--run", run.path(), "--prompt", "and the", "--tokens", "40", "--seed", "3"});
  ASSERT_EQ(g.exit_code, 0) << g.out;
  EXPECT_EQ(g.out.rfind("and the", 0), 0u) << g.out;
  EXPECT_GT(g.out.size(), 30u);
  auto g2 = run_bin("generate", {"--run", run.path(), "--prompt", "and the", "--tokens", "40", "--seed", "3"});
  EXPECT_EQ(g.out, g2.out);  // seeded
}

TEST_F(TrainE2E, SameSeedSameLosses) {
  TempDir a, b;
  std::vector<std::string> common = {test::source_path("configs/tiny.yaml"), "data.train=" + data(),
                                     "train.max_steps=6", "log.every_steps=1", "eval.batches=0",
                                     "model.dropout=0.1", "train.grad_accum=2"};
  auto ra = common, rb = common;
  ra.push_back("run.dir=" + a.path());
  rb.push_back("run.dir=" + b.path());
  ASSERT_EQ(run_bin("trainer", ra).exit_code, 0);
  ASSERT_EQ(run_bin("trainer", rb).exit_code, 0);
  auto train_only = [](std::vector<nlohmann::json> recs) {
    recs.erase(std::remove_if(recs.begin(), recs.end(), [](auto& j) { return j["kind"] != "train"; }), recs.end());
    return recs;
  };
  auto ma = train_only(read_jsonl(a / "metrics.jsonl")), mb = train_only(read_jsonl(b / "metrics.jsonl"));
  ASSERT_EQ(ma.size(), 6u);
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_EQ(ma[i]["loss"], mb[i]["loss"]);
  EXPECT_EQ(read_text(a / "model.safetensors"), read_text(b / "model.safetensors"));
}

// One line on stderr, exit code 2, for every kind of bad input.
void expect_bad_input(const test::RunResult& r, const std::string& needle) {
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << r.out;
}

TEST_F(TrainE2E, CliErrorsExit2WithOneLine) {
  TempDir run;
  const std::string tiny = test::source_path("configs/tiny.yaml");
  const std::string rd = "run.dir=" + run.path();
  expect_bad_input(run_bin("trainer", {}), "missing CONFIG.yaml");
  expect_bad_input(run_bin("trainer", {"/nonexistent.yaml"}), "/nonexistent.yaml: cannot open config file");
  expect_bad_input(run_bin("trainer", {tiny, "optim.lrr=1", rd}), "did you mean 'optim.lr'");
  expect_bad_input(run_bin("trainer", {tiny, "train.max_steps=-3", rd}), "key 'train.max_steps'");
  expect_bad_input(run_bin("trainer", {tiny, "stray", rd}), "'stray' is not a dotted.key=value");
  expect_bad_input(run_bin("trainer", {tiny, "data.train=" + run.path() + "/none", rd}), "manifest.json");
  test::write_text(run / "bad.yaml", "model:\n  n_layer: two\n");
  expect_bad_input(run_bin("trainer", {run / "bad.yaml", rd}), "bad.yaml:2: key 'model.n_layer'");
  expect_bad_input(run_bin("trainer", {tiny, "model.vocab_size=10", "data.train=" + data(), rd}),
                   "key 'model.vocab_size'");
  expect_bad_input(run_bin("generate", {}), "--run");
  expect_bad_input(run_bin("generate", {"--run", run.path() + "/missing"}), "cannot open config file");
  EXPECT_EQ(run_bin("trainer", {"--help"}).exit_code, 0);
}

// Validation says which data and split it ran on: a dataset without a val split is evaluated on its
// train split, said in the records and a warning; data.val of another tokenizer exits 2.
TEST_F(TrainE2E, ValidationNamesItsSplitAndRefusesAnotherTokenizer) {
  TempDir d, run;
  test::write_text(d / "c.txt", test::synthetic_corpus(400));
  ASSERT_EQ(run_bin("prep", {d / "c.txt", "--out", d / "noval", "--tokenizer", "bytes", "--val-fraction", "0", "--quiet"}).exit_code, 0);
  const std::vector<std::string> base = {test::source_path("configs/tiny.yaml"), "train.max_steps=2", "eval.batches=1",
                                         "log.every_steps=1"};
  auto args = base;
  args.insert(args.end(), {"data.train=" + d / "noval", "run.dir=" + run / "a"});
  auto r = run_bin("trainer", args);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("validation runs on its TRAIN split"), std::string::npos) << r.out;
  auto vals = test::metrics_of_kind(run / "a/metrics.jsonl", "val");
  ASSERT_EQ(vals.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(vals[0])["val_split"], "train");
  args = base;
  args.insert(args.end(), {"data.train=" + data(), "run.dir=" + run / "b"});
  ASSERT_EQ(run_bin("trainer", args).exit_code, 0);
  vals = test::metrics_of_kind(run / "b/metrics.jsonl", "val");
  ASSERT_EQ(vals.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(vals[0])["val_split"], "val");
  EXPECT_EQ(nlohmann::json::parse(vals[0])["val_data"], data());
  ASSERT_EQ(run_bin("prep", {d / "c.txt", "--out", d / "sp", "--tokenizer", "sentencepiece", "--vocab-size", "300",
                             "--quiet"}).exit_code, 0);
  args = base;
  args.insert(args.end(), {"data.train=" + data(), "data.val=" + d / "sp", "run.dir=" + run / "c"});
  expect_bad_input(run_bin("trainer", args), "key 'data.val'");
  EXPECT_FALSE(std::ifstream(run / "c/metrics.jsonl").good());
}

// MFU = this rank's matmul FLOPs / step time / peak, checked against the formula computed here
// from the config alone: per token 6 * (12*L*d^2 + V*d) + 12*L*d*T (position embedding excluded,
// tied head counted once), B*T real tokens per packed step, V the padded vocabulary (258 -> 320).
TEST_F(TrainE2E, MfuIsMatmulFlopsOverStepTimeAgainstThePeak) {
  TempDir run;
  auto r = run_bin("trainer", {test::source_path("configs/tiny.yaml"), "data.train=" + data(), "run.dir=" + run.path(),
                               "train.max_steps=4", "log.every_steps=1", "eval.batches=0", "log.peak_tflops=0.001"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const double L = 2, d = 64, T = 64, B = 8, V = 320, peak = 1e9;
  const double step_flops = B * T * (6 * (12 * L * d * d + V * d) + 12 * L * d * T);
  int n = 0;
  for (auto& j : read_jsonl(run / "metrics.jsonl")) {
    if (j["kind"] != "train") continue;
    ++n;
    const double want = 100.0 * step_flops / (j["step_ms"].get<double>() / 1e3) / peak;
    // The same quantities in double, in another order (the FLOPs are integers below 2^53: exact),
    // written with round-trip precision: a few roundings of 2^-53 each; 1e-12 leaves ~1000 of them.
    EXPECT_NEAR(j["mfu_pct"].get<double>(), want, 1e-12 * want) << j.dump();
  }
  EXPECT_EQ(n, 4);
  EXPECT_NE(r.out.find("not validation, checkpoint saves or logging"), std::string::npos) << r.out;
  // On CPU without log.peak_tflops: against the SGEMM peak measured at start, labelled so.
  TempDir cpu;
  r = run_bin("trainer", {test::source_path("configs/tiny.yaml"), "data.train=" + data(), "run.dir=" + cpu.path(),
                          "train.max_steps=2", "log.every_steps=1", "eval.batches=0"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("SGEMM peak measured at start on this machine"), std::string::npos) << r.out;
  // The same formula against the measured peak the log names ("MFU against X TFLOP/s", 4 digits;
  // a run faster than it measures again once and says so: then the higher one).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(r.out, m, std::regex(R"(MFU against ([0-9.e+-]+) TFLOP/s \(CPU: SGEMM)"))) << r.out;
  std::vector<double> peaks = {std::stod(m[1]) * 1e12};
  if (std::regex_search(r.out, m, std::regex(R"(measured again: ([0-9.e+-]+) TFLOP/s)")))
    peaks.push_back(std::max(peaks[0], std::stod(m[1]) * 1e12));
  n = 0;
  for (auto& j : read_jsonl(cpu / "metrics.jsonl"))
    if (j["kind"] == "train") {
      ++n;
      const double got = j["mfu_pct"].get<double>();
      bool near = false;
      for (double p : peaks) {
        const double want = 100.0 * step_flops / (j["step_ms"].get<double>() / 1e3) / p;
        near = near || std::abs(got - want) <= 1e-3 * want;  // the log's 4 digits
      }
      EXPECT_TRUE(near) << j.dump() << " against the peak(s) of the log:\n" << r.out;
    }
  EXPECT_EQ(n, 2);
}

// README's recipe reruns a sweep-named run (with '=' in its directory) started with one thread per
// pool (set by environment, as bin/sweep does) from a plain shell, byte for byte: meta.json records
// the numerics environment and the recipe replays it.
TEST_F(TrainE2E, ReadmeRecipeReproducesASweepRunFromMetaJson) {
  TempDir root;
  const std::string run = root / "sweep/lr=3e-3_d_model=32", again = root / "rerun";
  auto p = test::spawn_bin("trainer", {test::source_path("configs/tiny.yaml"), "data.train=" + data(), "run.dir=" + run,
                                       "train.max_steps=6", "eval.batches=0", "optim.lr=3e-3", "model.d_model=32",
                                       "train.threads=1"},
                           root / "first.log", {"OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1", "MKL_NUM_THREADS=1"});
  ASSERT_EQ(test::wait_proc(p, 120), 0) << read_text(root / "first.log");
  const auto meta = nlohmann::json::parse(read_text(run + "/meta.json"));
  ASSERT_TRUE(meta.contains("numerics")) << meta.dump();
  EXPECT_EQ(meta["numerics"]["env"]["OPENBLAS_NUM_THREADS"], "1");
  EXPECT_EQ(meta["numerics"]["torch_intra_op_threads"], 1);
  if (!meta["numerics"]["openblas"].is_null()) {
    EXPECT_EQ(meta["numerics"]["openblas"]["threads"], 1);
  }
  // The README's line, verbatim but for the paths, from a shell without those variables.
  test::write_text(root / "recipe.sh", R"SH(RUN=$1 NEW=$2
env $(jq -r '.numerics.env | to_entries[] | "\(.key)=\(.value)"' "$RUN/meta.json") \
  "$TRAINER" "$RUN/config.yaml" run.dir="$NEW"
)SH");
  const std::string recipe = "env -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS -u MKL_NUM_THREADS TRAINER='" +
                             test::bin_path("trainer") + "' bash '" + root.path() + "/recipe.sh' '" + run + "' '" + again + "'";
  auto r = run_bin("/bin/bash", {"-c", recipe});
  ASSERT_EQ(r.exit_code, 0) << recipe << "\n" << r.out;
  EXPECT_EQ(read_text(run + "/model.safetensors"), read_text(again + "/model.safetensors"));
  const auto meta2 = nlohmann::json::parse(read_text(again + "/meta.json"));
  EXPECT_EQ(meta2["numerics"], meta["numerics"]);
}

}  // namespace
}  // namespace lm
