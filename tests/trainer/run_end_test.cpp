// How a run ends when its data does, and how a start is refused, in real trainer processes:
// - a mixture whose every source is capped by max_epochs is refused at start when train.max_steps
//   lies beyond its data (one line naming the step the data ends at; nothing written), also when
//   resumed;
// - a data error met mid-run (a damaged shard) first saves the last whole step's checkpoint and the
//   weights and records why in meta.json; the same command again loses nothing;
// - every refused start (a removed, changed or re-tokenized source, another data.shuffle_buffer,
//   another architecture or data version over a damaged newest checkpoint, a config too big for
//   memory) prints one line and leaves the run directory byte for byte as it was.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "common/checksum.h"
#include "common/files.h"
#include "data/format/manifest.h"
#include "tests/testutil.h"
#include "tests/trainer/dataset_copy.h"

namespace lm {
namespace {

namespace fs = std::filesystem;
using test::TempDir;
using test::other_tokenizer_copy;

// Every file under dir (but the log and the lock, which a refused start may open) -> its bytes.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (rel.rfind("logs", 0) == 0 || rel == "run.lock") continue;
    out[rel] = e.is_regular_file() ? test::read_text(e.path().string()) : "<dir>";
  }
  return out;
}

// The paths whose bytes differ between two snapshots ("" when none).
std::string changed(const std::map<std::string, std::string>& a, const std::map<std::string, std::string>& b) {
  std::string out;
  for (const auto& [path, bytes] : a)
    if (!b.count(path) || b.at(path) != bytes) out += " " + path + (b.count(path) ? " (changed)" : " (gone)");
  for (const auto& [path, bytes] : b)
    if (!a.count(path)) out += " " + path + " (new)";
  return out;
}

void expect_refused_in_one_line(const test::RunResult& r, const std::string& needle, const std::string& what) {
  EXPECT_EQ(r.exit_code, 2) << what << "\n" << r.out;
  EXPECT_NE(r.out.find(needle), std::string::npos) << what << "\n" << r.out;
  EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << what << "\n" << r.out;
}

std::vector<std::string> args(const std::string& run, std::vector<std::string> extra) {
  std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "run.dir=" + run, "log.every_steps=1",
                                "eval.batches=0", "train.threads=1", "model.seq_len=32", "train.micro_batch_size=8"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

int64_t meta_exit_code(const std::string& run) {
  return nlohmann::json::parse(test::read_text(run + "/meta.json")).at("exit_code").get<int64_t>();
}

// Every source at max_epochs: 1 (the issue's ~18 steps of data), max_steps 30: refused at start with
// the step the data ends at; that max_steps trains to the end; the first command again, resumed
// there, is refused with the same step and the run directory unchanged.
TEST(RunEnd, DataThatEndsBeforeMaxStepsIsRefusedAtStart) {
  TempDir tmp;
  const std::string data = test::make_bytes_dataset(tmp / "d", 150), run = tmp / "run";
  const std::string sources = "data.sources=[{name: a, path: " + data + ", max_epochs: 1}, {name: b, path: " + data +
                              ", weight: 2, max_epochs: 1}]";
  const auto first = args(run, {"data.train=", sources, "train.max_steps=300", "checkpoint.every_steps=5"});
  auto r = test::run_bin("trainer", first);
  expect_refused_in_one_line(r, "train.max_steps=300 cannot be reached: the data ends after step ", "fresh");
  EXPECT_FALSE(fs::exists(run + "/config.yaml"));
  EXPECT_FALSE(fs::exists(run + "/meta.json"));
  EXPECT_FALSE(fs::exists(run + "/model.safetensors"));
  const size_t at = r.out.find("the data ends after step ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const int last = std::atoi(r.out.c_str() + at + 25);
  ASSERT_GT(last, 5) << r.out;
  ASSERT_LT(last, 300) << r.out;
  EXPECT_NE(r.out.find("set train.max_steps=" + std::to_string(last)), std::string::npos) << r.out;
  // Its suggestion trains to the end of the data.
  r = test::run_bin("trainer", args(run, {"data.train=", sources, "train.max_steps=" + std::to_string(last),
                                         "checkpoint.every_steps=5"}));
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(test::last_train_step(run + "/metrics.jsonl"), last);
  EXPECT_TRUE(fs::exists(run + "/model.safetensors"));
  // The first command again: resumed at the end of the data, refused the same way, nothing written.
  const auto before = snapshot(run);
  r = test::run_bin("trainer", first);
  expect_refused_in_one_line(r, "the data ends after step " + std::to_string(last) + " ", "resumed");
  EXPECT_EQ(changed(before, snapshot(run)), "");
}

// A shard that fails its checksum mid-run (the run could not know): the last whole step's
// checkpoint and the weights are saved, meta.json says why, exit 2 with the error as the last line;
// the same command again resumes there and loses nothing.
TEST(RunEnd, ADataErrorMidRunKeepsTheLastStep) {
  TempDir tmp;
  test::write_text(tmp / "corpus.txt", test::synthetic_corpus(3000));
  auto p = test::run_bin("prep", {tmp / "corpus.txt", "--out", tmp / "data", "--tokenizer", "bytes", "--shard-tokens",
                                  "20000", "--val-fraction", "0.05", "--quiet"});
  ASSERT_EQ(p.exit_code, 0) << p.out;
  const data::Manifest m = data::Manifest::load(tmp / "data");
  std::vector<std::string> train;
  for (const auto& s : m.shards)
    if (s.split == "train") train.push_back(tmp / "data/" + s.file);
  ASSERT_GE(train.size(), 4u);
  // Damage one token in the middle of the last train shard (its size unchanged); unshuffled, it is
  // read last in the epoch.
  std::string bytes = test::read_text(train.back());
  bytes[bytes.size() / 2] ^= 0x5a;
  test::write_text(train.back(), bytes);
  const std::string run = tmp / "run";
  const auto cmd = args(run, {"data.train=" + (tmp / "data"), "train.max_steps=2000", "checkpoint.every_steps=1000",
                              "data.shuffle=false"});
  auto r = test::run_bin("trainer", cmd);
  ASSERT_EQ(r.exit_code, 2) << r.out;
  const std::string tail = r.out.substr(r.out.rfind('\n', r.out.size() - 2) + 1);
  EXPECT_NE(tail.find("trainer: error: "), std::string::npos) << r.out;
  EXPECT_NE(tail.find("checksum"), std::string::npos) << r.out;
  const size_t at = tail.find("stopped after step ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const int last = std::atoi(tail.c_str() + at + 19);
  ASSERT_GT(last, 0) << r.out;
  EXPECT_EQ(test::last_train_step(run + "/metrics.jsonl"), last);
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", last);
  EXPECT_TRUE(fs::exists(run + "/checkpoints/" + name)) << r.out;
  EXPECT_TRUE(fs::exists(run + "/model.safetensors")) << r.out;
  const auto meta = nlohmann::json::parse(test::read_text(run + "/meta.json"));
  EXPECT_EQ(meta.at("status"), "failed");
  EXPECT_EQ(meta.at("exit_code"), 2);
  EXPECT_NE(meta.at("error").get<std::string>().find("stopped after step " + std::to_string(last)), std::string::npos);
  // Again: resumed at that step, the same shard fails at once; checkpoints and weights unchanged.
  const std::string weights = test::read_text(run + "/model.safetensors");
  r = test::run_bin("trainer", cmd);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find("resumed from"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_text(run + "/model.safetensors"), weights);
  EXPECT_TRUE(fs::exists(run + "/checkpoints/" + name));
  EXPECT_EQ(meta_exit_code(run), 2);
}

// Each refusal of a start leaves the run directory byte for byte as it was (config.yaml,
// checkpoints, no quarantine) and prints one line.
TEST(RunEnd, ARefusedStartWritesNothingAndSaysOneLine) {
  TempDir tmp;
  const std::string data = test::shared_bytes_dataset(), other = test::make_bytes_dataset(tmp / "o", 2000);
  const std::string retok_a = other_tokenizer_copy(data, tmp / "ta"), retok_b = other_tokenizer_copy(data, tmp / "tb");
  auto mix = [&](const std::string& a, const std::string& b) {
    return "data.sources=[{name: a, path: " + a + "}" + (b.empty() ? "" : ", {name: b, path: " + b + "}") + "]";
  };
  // The base runs: checkpoints at steps 3 and 6, the newest then damaged (a refusal must not move it).
  const std::vector<std::string> base = {"train.max_steps=6", "checkpoint.every_steps=3"};
  auto make_base = [&](const std::string& run, const std::vector<std::string>& data_args) {
    auto a = args(run, base);
    a.insert(a.end(), data_args.begin(), data_args.end());
    auto r = test::run_bin("trainer", a);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    std::string state = test::read_text(run + "/checkpoints/step_00000006/state.json");
    state[state.size() / 2] ^= 0x01;
    test::write_text(run + "/checkpoints/step_00000006/state.json", state);
  };
  make_base(tmp / "mix", {"data.train=", mix(data, data)});
  make_base(tmp / "one", {"data.train=" + data});
  // A dataset without a val split: validation warns that it runs on the train split.
  test::write_text(tmp / "nv.txt", test::synthetic_corpus(500));
  auto p = test::run_bin("prep", {tmp / "nv.txt", "--out", tmp / "noval", "--tokenizer", "bytes", "--val-fraction", "0", "--quiet"});
  ASSERT_EQ(p.exit_code, 0) << p.out;
  struct Kind {
    std::string name, base, needle;
    std::vector<std::string> extra;
  };
  const std::vector<Kind> kinds = {
      {"removed source", "mix", "source 'b' was read", {"data.train=", mix(data, "")}},
      {"changed source", "mix", "source 'b' changed: data version", {"data.train=", mix(data, other)}},
      {"changed tokenizer", "mix", "the tokenizer changed", {"data.train=", mix(retok_a, retok_b)}},
      {"changed shuffle_buffer", "one", "shuffle_buffer", {"data.train=" + data, "data.shuffle_buffer=77"}},
      {"other architecture", "mix", "has model architecture", {"data.train=", mix(data, data), "model.n_layer=3"}},
      {"other data version", "one", "has data version", {"data.train=" + other}},
      {"memory", "one", "estimated", {"data.train=" + (tmp / "noval"), "eval.batches=2", "model.d_model=32768"}},
  };
  for (const auto& k : kinds) {
    const std::string run = tmp / ("r_" + std::to_string(&k - kinds.data()));
    fs::copy(tmp / k.base, run, fs::copy_options::recursive);
    const auto before = snapshot(run);
    ASSERT_TRUE(before.count("config.yaml")) << k.name;
    auto a = args(run, {"train.max_steps=12", "checkpoint.every_steps=3"});
    a.insert(a.end(), k.extra.begin(), k.extra.end());
    expect_refused_in_one_line(test::run_bin("trainer", a), k.needle, k.name);
    EXPECT_EQ(changed(before, snapshot(run)), "") << k.name;
    EXPECT_FALSE(fs::exists(run + "/checkpoints/quarantine")) << k.name;
  }
}

}  // namespace
}  // namespace lm
