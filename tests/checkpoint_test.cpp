// Checkpointer: layout, manifest, verification, damaged-checkpoint skipping, retention, sync and
// async (forked) saves.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "tests/testutil.h"
#include "trainer/checkpoint/checkpoint.h"
#include "common/errors.h"
#include "trainer/checkpoint/state.h"

namespace lm {
namespace {

CheckpointState make_state(int64_t step, float fill) {
  CheckpointState st;
  st.step = step;
  st.run = {{"data_version", "v"}};
  st.replicated["progress"].values = {{"step", step}};
  st.replicated["model"].tensors = {{"w", torch::full({64, 64}, fill)}, {"b", torch::arange(8, torch::kFloat)}};
  st.replicated["optimizer"].tensors = {{"exp_avg/w", torch::full({64, 64}, fill / 2)}};
  st.per_rank["loader"].values = {{"cursor", step * 10}};
  return st;
}

std::vector<std::string> names(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::directory_iterator(dir)) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(Checkpoint, LayoutManifestAndRoundTrip) {
  test::TempDir run;
  CheckpointConfig cfg;
  Checkpointer ck(cfg, run.path(), 0, 1);
  ck.save(make_state(7, 1.5f));
  auto reports = ck.finished();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].error.empty()) << reports[0].error;
  const std::string dir = run / "checkpoints/step_00000007";
  EXPECT_EQ(names(dir), (std::vector<std::string>{"manifest.json", "model.safetensors", "optimizer.safetensors",
                                                  "rank_0.json", "state.json"}));
  EXPECT_EQ(Checkpointer::verify(dir), "");
  CheckpointState st;
  EXPECT_EQ(ck.load_resume(&st), dir);
  EXPECT_EQ(st.step, 7);
  EXPECT_EQ(st.run["data_version"], "v");
  EXPECT_EQ(st.replicated["progress"].values["step"], 7);
  EXPECT_EQ(st.per_rank["loader"].values["cursor"], 70);
  EXPECT_EQ(st.saved_rank, 0);
  const auto& model = st.replicated["model"].tensors;
  ASSERT_EQ(model.size(), 2u);
  EXPECT_TRUE(torch::equal(model[1].second, torch::full({64, 64}, 1.5f)));  // sorted: b, w
  const auto state = nlohmann::json::parse(test::read_text(dir + "/state.json"));
  EXPECT_EQ(state["magic"], kCheckpointMagic);
  EXPECT_EQ(state["version"], 2);
  EXPECT_EQ(state["tensor_files"]["model"], "model.safetensors");
}

TEST(Checkpoint, DamagedOrIncompleteAreSkippedWithReason) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.keep_last = 0;
  Checkpointer ck(cfg, run.path(), 0, 1);
  for (int s : {1, 2, 3, 4}) ck.save(make_state(s, static_cast<float>(s)));
  // step 4: one flipped byte; step 3: no manifest (as if killed before the commit).
  const std::string d4 = run / "checkpoints/step_00000004", d3 = run / "checkpoints/step_00000003";
  {
    std::fstream f(d4 + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    char c;
    f.read(&c, 1);
    f.seekp(200);
    c ^= 0x40;
    f.write(&c, 1);
  }
  std::filesystem::remove(d3 + "/manifest.json");
  EXPECT_NE(Checkpointer::verify(d4).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(Checkpointer::verify(d3).find("manifest.json"), std::string::npos);
  CheckpointState st;
  EXPECT_EQ(ck.load_resume(&st), run / "checkpoints/step_00000002");
  EXPECT_EQ(st.step, 2);
  EXPECT_THROW(ck.load(d4), CheckpointError);  // the checksum is checked while loading
  // An explicit, damaged path is refused.
  cfg.resume = d4;
  Checkpointer explicit_ck(cfg, run.path(), 0, 1);
  EXPECT_THROW(explicit_ck.load_resume(&st), CheckpointError);
  cfg.resume = "none";
  EXPECT_EQ(Checkpointer(cfg, run.path(), 0, 1).load_resume(&st), "");
}

TEST(Checkpoint, RetentionKeepsNewestAndMilestones) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.keep_last = 2;
  cfg.keep_every = 4;
  Checkpointer ck(cfg, run.path(), 0, 1);
  for (int s = 1; s <= 9; ++s) ck.save(make_state(s, 1.0f));
  EXPECT_EQ(names(run / "checkpoints"),
            (std::vector<std::string>{"step_00000004", "step_00000008", "step_00000009"}));
}

TEST(Checkpoint, StaleTempDirsRemovedAndNeverResumed) {
  test::TempDir run;
  std::filesystem::create_directories(run / "checkpoints/step_00000005.tmp");
  test::write_text(run / "checkpoints/step_00000005.tmp/model.safetensors", "partial");
  CheckpointConfig cfg;
  Checkpointer ck(cfg, run.path(), 0, 1);
  EXPECT_FALSE(std::filesystem::exists(run / "checkpoints/step_00000005.tmp"));
  CheckpointState st;
  EXPECT_EQ(ck.load_resume(&st), "");
}

TEST(Checkpoint, AsyncForkWritesTheSnapshotNotLaterChanges) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.async = true;
  Checkpointer ck(cfg, run.path(), 0, 1);
  auto st = make_state(3, 2.0f);
  auto w = st.replicated["model"].tensors[0].second;
  ck.save(st);
  w.fill_(9.0f);  // training goes on and changes the weights
  ck.wait();
  auto reports = ck.finished();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].async);
  EXPECT_TRUE(reports[0].error.empty()) << reports[0].error;
  auto back = ck.load(run / "checkpoints/step_00000003");
  EXPECT_TRUE(torch::equal(back.replicated["model"].tensors[1].second, torch::full({64, 64}, 2.0f)));
}

TEST(Checkpoint, FailedSaveKeepsEarlierCheckpoints) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.on_error = "continue";
  Checkpointer ck(cfg, run.path(), 0, 1);
  ck.save(make_state(1, 1.0f));
  ck.finished();
  // A plain file where the next temp directory must go makes the save fail.
  test::write_text(run / "checkpoints/step_00000002.tmp", "in the way");
  ck.save(make_state(2, 2.0f));
  auto r = ck.finished();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].error.find("step_00000002.tmp"), std::string::npos) << r[0].error;
  CheckpointState st;
  EXPECT_EQ(ck.load_resume(&st), run / "checkpoints/step_00000001");
  cfg.on_error = "stop";
  Checkpointer strict(cfg, run.path(), 0, 1);
  test::write_text(run / "checkpoints/step_00000003.tmp", "in the way");
  EXPECT_THROW(strict.save(make_state(3, 3.0f)), Error);
}

// A checkpoint written by the previous format (version 1) is refused with one line naming it and
// both versions, also by resume: auto (never silently skipped into a fresh start).
TEST(Checkpoint, PreviousFormatVersionIsRefused) {
  test::TempDir run;
  CheckpointConfig cfg;
  Checkpointer ck(cfg, run.path(), 0, 1);
  ck.save(make_state(5, 1.0f));
  const std::string dir = run / "checkpoints/step_00000005";
  auto m = nlohmann::json::parse(test::read_text(dir + "/manifest.json"));
  m["version"] = 1;
  test::write_text(dir + "/manifest.json", m.dump(2) + "\n");
  CheckpointState st;
  try {
    ck.load_resume(&st);
    ADD_FAILURE() << "a version 1 checkpoint was not refused";
  } catch (const CheckpointError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir), std::string::npos) << what;
    EXPECT_NE(what.find("format version 1, this build reads version 2"), std::string::npos) << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
    EXPECT_EQ(e.exit_code(), kExitBadInput);
  }
  cfg.resume = "none";
  EXPECT_EQ(Checkpointer(cfg, run.path(), 0, 1).load_resume(&st), "");
}

// The registry composes components by key and refuses a checkpoint that lacks a required one.
TEST(Checkpoint, RegistryComposesComponentsByKey) {
  int64_t counter = 41;
  std::vector<int64_t> loaded;
  StateRegistry reg;
  using S = StateRegistry::Scope;
  reg.add("counter", S::kReplicated, [&] { return ComponentState{{{"n", counter}}, {}}; },
          [&](const ComponentState* s) { loaded.push_back(s->values.at("n").get<int64_t>()); });
  reg.add("mine", S::kPerRank, [&] { return ComponentState{{{"r", 3}}, {}}; },
          [&](const ComponentState* s) { loaded.push_back(s->values.at("r").get<int64_t>()); });
  reg.add("extra", S::kReplicated, [&] { return ComponentState{}; },
          [&](const ComponentState* s) { loaded.push_back(s ? 1 : -1); }, /*optional=*/true);
  EXPECT_THROW(reg.add("mine", S::kPerRank, nullptr, nullptr), Error);
  auto st = reg.snapshot(9, {{"x", 1}});
  EXPECT_EQ(st.step, 9);
  EXPECT_EQ(st.replicated.count("counter"), 1u);
  EXPECT_EQ(st.per_rank.count("mine"), 1u);
  st.replicated.erase("extra");
  reg.restore(st, "ckpt");
  EXPECT_EQ(loaded, (std::vector<int64_t>{41, 3, -1}));
  st.replicated.erase("counter");
  try {
    reg.restore(st, "ckpt");
    ADD_FAILURE() << "a missing component was accepted";
  } catch (const CheckpointError& e) {
    EXPECT_EQ(std::string(e.what()), "ckpt: has no state for 'counter'");
  }
}

}  // namespace
}  // namespace lm

namespace lm {
namespace {

TEST(Checkpoint, AFlippedByteInAnyFileIsCaught) {
  test::TempDir run;
  CheckpointConfig cfg;
  Checkpointer ck(cfg, run.path(), 0, 1);
  auto st = make_state(1, 1.0f);
  st.replicated["ema"].tensors = {{"w", torch::ones({4, 4})}};
  ck.save(st);
  const std::string dir = run / "checkpoints/step_00000001";
  for (const auto& name : names(dir)) {
    if (name == "manifest.json") continue;
    const std::string path = dir + "/" + name;
    const std::string orig = test::read_text(path);
    std::string bad = orig;
    bad[bad.size() / 2] ^= 0x01;
    test::write_text(path, bad);
    EXPECT_EQ(Checkpointer::verify(dir), path + ": checksum mismatch") << name;
    try {
      ck.load(dir);
      ADD_FAILURE() << "load accepted a flipped byte in " << name;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
    test::write_text(path, orig);
    EXPECT_EQ(Checkpointer::verify(dir), "") << name;
  }
  EXPECT_EQ(names(dir).size(), 6u);  // model, optimizer, ema, state, rank_0, manifest
}

}  // namespace
}  // namespace lm
