// The trainer on raw text (data.text): the same batches as from prep's shards of the same file, an
// exact resume after SIGKILL at a point the test does not choose, and the source recorded in
// meta.json.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>

#include "tests/remote_servers.h"  // count_in
#include "tests/testutil.h"
#include "run/run_dir.h"

namespace lm {
namespace {

using test::TempDir;
using Hashes = std::map<int64_t, std::string>;  // step -> batch_hash

class TextTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937 rng(11);
    static const char* words[] = {"and", "the", "LORD", "spake", "unto", "Moses", "saying", "of", "Israel", "children"};
    std::string text;
    for (int i = 0; i < 4000; ++i) {
      text += "Ge" + std::to_string(i) + ":1";
      for (int w = 0, k = 3 + static_cast<int>(rng() % 20); w < k; ++w) text += std::string(" ") + words[rng() % 10];
      text += "\n";
    }
    test::write_text(tmp_ / "corpus.txt", text);
  }
  std::string config(const std::string& name, const std::string& data, int steps) {
    const std::string p = tmp_ / (name + ".yaml");
    test::write_text(p, "run: {dir: " + (tmp_ / ("runs/" + name)) + ", seed: 3}\n"
                        "data: {" + data + ", shuffle_buffer: 64, cache_dir: " + (tmp_ / "cache") + "}\n"
                        "model: {n_layer: 1, n_head: 2, d_model: 32, seq_len: 32}\n"
                        "optim: {lr: 3.0e-3}\nschedule: {warmup_steps: 2}\n"
                        "train: {max_steps: " + std::to_string(steps) + ", micro_batch_size: 8}\n"
                        "checkpoint: {every_steps: 5}\nlog: {every_steps: 1}\neval: {batches: 2, every_steps: 0}\n");
    return p;
  }
  Hashes batch_hashes(const std::string& name) {
    return test::step_batch_hashes(run_dir::metrics(tmp_ / ("runs/" + name)));
  }
  TempDir tmp_;
};

// Unshuffled, raw text and prep's shards of the same file give the same batches step by step.
TEST_F(TextTrainTest, RawTextTrainsOnPrepsBatches) {
  auto p = test::run_bin("prep", {tmp_ / "corpus.txt", "--out", tmp_ / "shards", "--quiet"});
  ASSERT_EQ(p.exit_code, 0) << p.out;
  auto a = test::run_bin("trainer", {config("shards", "train: " + (tmp_ / "shards") + ", shuffle: false", 40)});
  ASSERT_EQ(a.exit_code, 0) << a.out;
  auto b = test::run_bin("trainer", {config("raw", "train: " + (tmp_ / "corpus.txt") + ", text: line, shuffle: false", 40)});
  ASSERT_EQ(b.exit_code, 0) << b.out;
  EXPECT_EQ(batch_hashes("raw").size(), 40u);
  EXPECT_EQ(batch_hashes("raw"), batch_hashes("shards"));
  const auto meta = nlohmann::json::parse(test::read_text(run_dir::meta(tmp_ / "runs/raw")));
  EXPECT_EQ(meta.at("data").at("sources").at(0).at("kind"), "text") << meta.dump();
  EXPECT_EQ(meta.at("data").at("sources").at(0).at("location"), tmp_ / "corpus.txt");
  auto g = test::run_bin("generate", {"--run", tmp_ / "runs/raw", "--prompt", "Ge1", "--tokens", "8"});
  EXPECT_EQ(g.exit_code, 0) << g.out;  // the tokenizer named by data.tokenizer (bytes)
}

// A mixture of a prepared dataset and raw text (one tokenizer, data.tokenizer = prep's model);
// a tokenizer that is not one: exit 2 naming the key.
TEST_F(TextTrainTest, RawTextMixesWithPreparedSources) {
  auto p = test::run_bin("prep", {tmp_ / "corpus.txt", "--out", tmp_ / "sp", "--tokenizer", "sentencepiece",
                                  "--vocab-size", "300", "--quiet"});
  ASSERT_EQ(p.exit_code, 0) << p.out;
  const std::string sources = "sources: [{name: shards, path: " + (tmp_ / "sp") + ", weight: 1}, {name: raw, path: " +
                              (tmp_ / "corpus.txt") + ", text: line, weight: 3}], tokenizer: ";
  auto r = test::run_bin("trainer", {config("mix", sources + (tmp_ / "sp/tokenizer.model"), 30)});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto meta = nlohmann::json::parse(test::read_text(run_dir::meta(tmp_ / "runs/mix")));
  EXPECT_EQ(meta.at("data").at("sources").at(0).at("kind"), "local") << meta.dump();
  EXPECT_EQ(meta.at("data").at("sources").at(1).at("kind"), "text") << meta.dump();
  auto bad = test::run_bin("trainer", {config("bad", sources + "bytes", 30)});  // raw bytes vs prep's BPE
  EXPECT_EQ(bad.exit_code, 2) << bad.out;
  EXPECT_NE(bad.out.find("share one tokenizer"), std::string::npos) << bad.out;
  auto missing = test::run_bin("trainer", {config("missing", sources + (tmp_ / "nope.model"), 30)});
  EXPECT_EQ(missing.exit_code, 2) << missing.out;
  EXPECT_EQ(test::count_in(missing.out, "error"), 1) << missing.out;
  EXPECT_NE(missing.out.find("key 'data.tokenizer'"), std::string::npos) << missing.out;
}

// SIGKILL once a checkpoint exists, then the same command again: it resumes, and every step's
// batch equals the uninterrupted run's.
TEST_F(TextTrainTest, KilledRunResumesWithTheSameBatches) {
  const std::string data = "train: " + (tmp_ / "corpus.txt") + ", text: line";
  const int steps = 120;
  auto straight = test::run_bin("trainer", {config("straight", data, steps)});
  ASSERT_EQ(straight.exit_code, 0) << straight.out;
  const std::string cfg = config("cut", data, steps);
  auto proc = test::spawn_bin(test::bin_path("trainer"), {cfg}, tmp_ / "cut.log");
  const std::string ckpt = run_dir::checkpoint(tmp_ / "runs/cut", 15);
  ASSERT_TRUE(test::wait_until(proc, [&] { return std::filesystem::exists(ckpt); }, 120)) << test::read_text(tmp_ / "cut.log");
  test::kill_proc(proc, SIGKILL);
  test::wait_proc(proc, 30);
  auto rerun = test::run_bin("trainer", {cfg});
  ASSERT_EQ(rerun.exit_code, 0) << rerun.out;
  EXPECT_NE(rerun.out.find("resumed from"), std::string::npos) << rerun.out;
  EXPECT_EQ(batch_hashes("cut"), batch_hashes("straight"));
}

}  // namespace
}  // namespace lm
