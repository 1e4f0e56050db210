// Checkpointer: layout, manifest, verification, damaged-checkpoint skipping, retention, sync and
// async (forked) saves.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>

#include "tests/testutil.h"
#include "trainer/checkpoint/checkpoint.h"
#include "common/errors.h"

namespace lm {
namespace {

CheckpointState make_state(int64_t step, float fill) {
  CheckpointState st;
  st.step = step;
  st.state = {{"progress", {{"step", step}}}};
  st.model = {{"w", torch::full({64, 64}, fill)}, {"b", torch::arange(8, torch::kFloat)}};
  st.optimizer = {{"exp_avg/w", torch::full({64, 64}, fill / 2)}};
  st.rank_state = {{"rank", 0}, {"loader", {{"cursor", step * 10}}}};
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
  EXPECT_EQ(st.state["magic"], kCheckpointMagic);
  EXPECT_EQ(st.rank_state["loader"]["cursor"], 70);
  ASSERT_EQ(st.model.size(), 2u);
  EXPECT_TRUE(torch::equal(st.model[1].second, torch::full({64, 64}, 1.5f)));  // sorted: b, w
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
  auto w = st.model[0].second;
  ck.save(st);
  w.fill_(9.0f);  // training goes on and changes the weights
  ck.wait();
  auto reports = ck.finished();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].async);
  EXPECT_TRUE(reports[0].error.empty()) << reports[0].error;
  auto back = ck.load(run / "checkpoints/step_00000003");
  EXPECT_TRUE(torch::equal(back.model[1].second, torch::full({64, 64}, 2.0f)));
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

}  // namespace
}  // namespace lm

namespace lm {
namespace {

TEST(Checkpoint, AFlippedByteInAnyFileIsCaught) {
  test::TempDir run;
  CheckpointConfig cfg;
  Checkpointer ck(cfg, run.path(), 0, 1);
  auto st = make_state(1, 1.0f);
  st.ema = {{"w", torch::ones({4, 4})}};
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
