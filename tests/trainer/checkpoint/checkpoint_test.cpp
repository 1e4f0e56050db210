// Checkpointer: layout, manifest, verification, damaged-checkpoint skipping, retention, sync and
// async (staged) saves, their real-stall report and the Young/Daly interval.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sched.h>
#include <sys/types.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "tests/testutil.h"
#include "trainer/checkpoint/checkpoint.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/parallel.h"
#include "trainer/checkpoint/state.h"
#include "trainer/checkpoint/interval.h"
#include "trainer/checkpoint/stall.h"
#include "trainer/checkpoint/staging.h"
#include "trainer/optim/adamw.h"
#include "trainer/optim/ema.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <thread>
#include "tests/trainer/checkpoint/checkpoint_util.h"

namespace lm {
namespace {

using test::make_state;
using test::names;
using test::thread_named;

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
  EXPECT_EQ(CheckpointReader::verify(dir), "");
  CheckpointState st;
  EXPECT_EQ(ck.load_resume(&st), dir);
  EXPECT_EQ(st.step, 7);
  EXPECT_EQ(st.run["data_version"], "v");
  EXPECT_EQ(st.replicated["progress"].values["step"], 7);
  EXPECT_EQ(st.per_rank["loader"].values["cursor"], 70);
  EXPECT_EQ(st.saved_rank, 0);
  const auto model = st.replicated["model"].all_tensors();
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
  EXPECT_NE(CheckpointReader::verify(d4).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(CheckpointReader::verify(d3).find("manifest.json"), std::string::npos);
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

// The async save writes the state as it was at save(): once wait_snapshot() returned, training may
// change the weights (and the staging buffer is reused by the next save).
TEST(Checkpoint, AsyncWritesTheSnapshotNotLaterChanges) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.async = true;
  Checkpointer ck(cfg, run.path(), 0, 1);
  for (int64_t step : {3, 4}) {
    auto st = make_state(step, 2.0f * step);
    auto w = st.replicated["model"].tensors[0].second;
    ck.save(st);
    ck.wait_snapshot();
    w.fill_(9.0f);  // training goes on and changes the weights
    ck.wait();
    auto reports = ck.finished();
    ASSERT_EQ(reports.size(), 1u);
    EXPECT_TRUE(reports[0].async);
    EXPECT_TRUE(reports[0].error.empty()) << reports[0].error;
    auto back = ck.load(run / ("checkpoints/step_0000000" + std::to_string(step)));
    EXPECT_TRUE(torch::equal(back.replicated["model"].all_tensors()[1].second, torch::full({64, 64}, 2.0f * step)));
    EXPECT_TRUE(torch::equal(back.replicated["optimizer"].all_tensors()[0].second, torch::full({64, 64}, 1.0f * step)));
  }
}

// The checkpointer owns its fence: the optimizer and the EMA ask it (WriteFence) before they write
// the parameters, moments or average an async snapshot may still be copying, so an update right
// after save(), with nothing else waiting, still leaves the saved state as it was at save().
TEST(Checkpoint, AsyncSnapshotIsFencedByTheOptimizerAndTheEma) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.async = true;
  Checkpointer ck(cfg, run.path(), 0, 1);
  torch::manual_seed(0);
  torch::nn::Linear lin(1024, 1024);  // 4 MB of weights: more than one staging chunk
  FlatParams flat(*lin);
  AdamW opt(flat, OptimConfig{});
  Ema ema(flat, 0.5);
  opt.set_fence(&ck), ema.set_fence(&ck);
  ModuleState model(*lin, "model");
  StateRegistry reg;
  reg.add("model", StateRegistry::Scope::kReplicated, model);
  reg.add("optimizer", StateRegistry::Scope::kReplicated, opt);
  reg.add("ema", StateRegistry::Scope::kReplicated, ema);
  for (int64_t step : {1, 2}) {
    flat.grads().normal_();
    const torch::Tensor before = flat.params().clone(), m_before = opt.exp_avg().clone();
    ck.save(reg.snapshot(step, {{"data_version", "v"}}));
    opt.step(1e-1);  // no wait_snapshot() here: the optimizer's fence waits
    ema.update();
    ASSERT_FALSE(torch::equal(flat.params(), before));
    ck.wait();
    auto reports = ck.finished();
    ASSERT_EQ(reports.size(), 1u);
    ASSERT_TRUE(reports[0].error.empty()) << reports[0].error;
    auto back = ck.load(run / ("checkpoints/step_0000000" + std::to_string(step)));
    for (const auto& [name, t] : back.replicated["model"].all_tensors()) {
      const auto& e = *std::find_if(flat.entries().begin(), flat.entries().end(), [&](const auto& x) { return x.name == name; });
      EXPECT_TRUE(torch::equal(t.reshape({-1}), before.narrow(0, e.offset, e.numel))) << name << " at step " << step;
    }
    for (const auto& [name, t] : back.replicated["optimizer"].all_tensors())
      if (name.rfind("exp_avg/", 0) == 0) {
        const auto& e = *std::find_if(flat.entries().begin(), flat.entries().end(),
                                      [&](const auto& x) { return "exp_avg/" + x.name == name; });
        EXPECT_TRUE(torch::equal(t.reshape({-1}), m_before.narrow(0, e.offset, e.numel))) << name;
      }
  }
}

double rss_mb() {  // this process's resident memory
  std::ifstream in("/proc/self/statm");
  double pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * 4096.0 / (1 << 20);
}

// The thread named `comm` at normal priority; false when there is no such thread (yet).
bool raise_thread(const std::string& comm) {
  sched_param p{};
  const pid_t tid = thread_named(comm);
  return tid && sched_setscheduler(tid, SCHED_OTHER, &p) == 0;
}

// prepare() allocates the async staging buffer for the state and faults it in on a background
// thread, so that the first save neither allocates nor faults (it cost a 1.5 GB state's first save
// about 1 s of training); the faulting never shows in what is saved.
TEST(Checkpoint, AsyncPrepareFaultsTheStagingBufferInAheadOfTheFirstSave) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.async = true;
  Checkpointer ck(cfg, run.path(), 0, 1);
  auto st = make_state(5, 3.0f);
  const auto big = torch::arange(16 << 20, torch::kFloat);  // 64 MB
  st.replicated["optimizer"].tensors.emplace_back("exp_avg_sq/big", big);
  const double before = rss_mb();
  ck.prepare(st);
  // This test waits for the faulting thread: it raises it first, as any waiter must (beside busy
  // processes a thread at idle priority may wait minutes for a core; common/parallel.h).
  double grown = 0;
  for (int i = 0, raised = 0; i < 1200 && grown < 60; ++i) {  // up to 30 s
    raised = raised || raise_thread("ckpt-prefault");  // (named by the thread itself, once it runs)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    grown = rss_mb() - before;
  }
  EXPECT_GE(grown, 60) << "the buffer's 64 MB resident before any save";
  const double prepared = rss_mb();
  ck.save(st);
  ck.wait();
  auto reports = ck.finished();
  ASSERT_EQ(reports.size(), 1u);
  EXPECT_TRUE(reports[0].error.empty()) << reports[0].error;
  EXPECT_LT(rss_mb() - prepared, 16) << "the first save used the prepared buffer, not a new one";
  auto back = ck.load(run / "checkpoints/step_00000005");
  EXPECT_TRUE(torch::equal(back.replicated["optimizer"].all_tensors()[1].second, big));
  EXPECT_TRUE(torch::equal(back.replicated["model"].all_tensors()[1].second, torch::full({64, 64}, 3.0f)));
  // Synchronous saves have no staging buffer: nothing to prepare.
  CheckpointConfig sync_cfg;
  Checkpointer sync(sync_cfg, run.path() + "/sync", 0, 1);
  const double at = rss_mb();
  sync.prepare(st);
  EXPECT_LT(rss_mb() - at, 16);
}

// block_ms is the real stall: the save() call plus how much longer the steps that ran while the
// save was in flight took than the steps before it (median), not the save() call alone.
TEST(Checkpoint, AsyncReportsTheStepsExtraTimeAsItsStall) {
  test::TempDir run;
  CheckpointConfig cfg;
  cfg.async = true;
  Checkpointer ck(cfg, run.path(), 0, 1);
  for (double s : {0.10, 0.12, 0.10}) ck.step_done(s);  // baseline: median 0.10 s
  ck.save(make_state(1, 1.0f));
  std::vector<SaveReport> r;
  ck.step_done(0.30);  // in flight (or finishing): 0.2 s extra
  for (int i = 0; i < 500 && (r = ck.finished()).empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ck.step_done(0.10);  // in flight, no extra
  }
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(r[0].error.empty()) << r[0].error;
  EXPECT_NEAR(r[0].block_ms, r[0].call_ms + 200.0, 1e-6);
  // The next save's steps without one set the baseline again; a wait() counts as stall too.
  ck.save(make_state(2, 1.0f));
  ck.wait();
  r = ck.finished();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_GE(r[0].block_ms, r[0].call_ms);
}

TEST(Checkpoint, StallMeterSubtractsTheMedianCleanStep) {
  StallMeter m;
  EXPECT_DOUBLE_EQ(m.take(0.5), 0.5);  // no baseline yet: the fallback
  for (double s : {1.0, 3.0, 2.0}) m.step(s, false);
  EXPECT_DOUBLE_EQ(m.baseline_s(), 2.0);
  m.step(2.5, true), m.step(2.25, true);
  EXPECT_DOUBLE_EQ(m.take(9.0), 0.75);
  EXPECT_DOUBLE_EQ(m.take(9.0), 0.0);  // reset
  m.step(1.0, true);                   // faster than the baseline: no negative stall
  EXPECT_DOUBLE_EQ(m.take(9.0), 0.0);
}

// Young/Daly: interval = sqrt(2 * MTBF_job * C), MTBF_job = mtbf_hours per node / nodes.
// 1 h per node, 4 nodes: 900 s; C = 2 s: 60 s; at 0.1 s/step: 600 steps.
TEST(Checkpoint, YoungDalyIntervalFromMeasuredStallAndNodes) {
  CheckpointConfig cfg;
  cfg.every_steps = -1, cfg.mtbf_hours = 1.0;
  SaveInterval four(cfg, false, 4);
  four.record_cost(2.0);
  EXPECT_FALSE(four.due(599, 0, 0.1));
  EXPECT_EQ(four.interval_steps(), 600);
  EXPECT_TRUE(four.due(600, 0, 0.1));
  EXPECT_TRUE(four.due(1250, 650, 0.1));
  EXPECT_FALSE(four.due(1249, 650, 0.1));
  SaveInterval one(cfg, false, 1);  // one node: sqrt(2 * 3600 * 2) = 120 s = 1200 steps
  one.record_cost(2.0);
  EXPECT_FALSE(one.due(1199, 0, 0.1));
  EXPECT_EQ(one.interval_steps(), 1200);
  one.record_cost(0.5);  // a cheaper save (measured): sqrt(2 * 3600 * 0.5) = 60 s = 600 steps
  EXPECT_TRUE(one.due(600, 0, 0.1));
  EXPECT_EQ(one.interval_steps(), 600);
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

// The staging copies are exact at every alignment and size (they use non-temporal stores with a
// copied head and tail), whichever threads claim the chunks.
TEST(Checkpoint, StagingCopiesAreExactAtAnyAlignment) {
  std::vector<char> src((9 << 20) + 300), dst(src.size() + 64);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + i / 251);
  for (size_t dst_off : {0, 1, 7, 16, 33}) {
    for (size_t n : {size_t{0}, size_t{5}, size_t{63}, size_t{64}, size_t{1000}, src.size() - 17}) {
      std::fill(dst.begin(), dst.end(), 0);
      ChunkedCopy copy;
      copy.add(dst.data() + dst_off, src.data() + 17 * (n < src.size() - 17), n);
      std::thread other([&] { copy.copy_some(); });
      copy.copy_some();
      other.join();
      copy.wait();
      ASSERT_TRUE(copy.done());
      EXPECT_EQ(std::memcmp(dst.data() + dst_off, src.data() + 17 * (n < src.size() - 17), n), 0) << dst_off << " " << n;
      EXPECT_EQ(dst[dst_off + n], 0) << "wrote past the end: " << dst_off << " " << n;
    }
  }
}

// Writes to rank 1's completion marker (rank_1.done, or the file it is written as) slowly, so
// that rank 0, waiting for it, polls while it is half-written.
class SlowMarkerFs : public files::FileSystem {
 public:
  int open_for_write(const char* path, int* fd) override {
    int e = FileSystem::open_for_write(path, fd);
    if (e == 0 && std::string(path).find("rank_1.done") != std::string::npos) slow_fd_ = *fd;
    return e;
  }
  int write(int fd, const void* data, size_t n, size_t* written) override {
    if (fd == slow_fd_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(150));
    return FileSystem::write(fd, data, n, written);
  }

 private:
  std::atomic<int> slow_fd_{-1};
};

// Two ranks save one checkpoint: rank 0 commits it once rank 1's marker is there, and never reads
// the marker before it is whole (it did: a flaky "checkpoint failed" in a two-rank run).
TEST(Checkpoint, TwoRanksCommitOnlyWholeMarkers) {
  test::TempDir run;
  SlowMarkerFs fs;
  files::set_file_system(&fs);
  CheckpointConfig cfg;
  cfg.on_error = "continue";
  cfg.commit_timeout_s = 20;
  Checkpointer r0(cfg, run.path(), 0, 2), r1(cfg, run.path(), 1, 2);
  std::thread other([&] { r1.save(make_state(4, 1.0f)); });
  r0.save(make_state(4, 1.0f));
  other.join();
  files::set_file_system(nullptr);
  auto r = r0.finished();
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].error, "");
  const std::string dir = run / "checkpoints/step_00000004";
  ASSERT_EQ(CheckpointReader::verify(dir), "");
  EXPECT_EQ(names(dir), (std::vector<std::string>{"manifest.json", "model.safetensors", "optimizer.safetensors",
                                                  "rank_0.json", "rank_1.json", "state.json"}));
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

// A component that saves {key: value} and records what it is given back (-1: nothing).
struct Counter : Stateful {
  std::string key;
  int64_t value;
  std::vector<int64_t>* loaded;
  Counter(std::string k, int64_t v, std::vector<int64_t>* l) : key(std::move(k)), value(v), loaded(l) {}
  ComponentState state() const override { return {{{key, value}}, {}}; }
  void load_state(const ComponentState* s) override { loaded->push_back(s ? s->values.at(key).get<int64_t>() : -1); }
};

// The registry composes components by key and refuses a checkpoint that lacks a required one; an
// own-rank component gets nothing from another rank's state.
TEST(Checkpoint, RegistryComposesComponentsByKey) {
  std::vector<int64_t> loaded;
  Counter counter("n", 41, &loaded), mine("r", 3, &loaded), extra("e", 1, &loaded), own("o", 5, &loaded);
  StateRegistry reg;
  using S = StateRegistry::Scope;
  reg.add("counter", S::kReplicated, counter);
  reg.add("mine", S::kPerRank, mine);
  reg.add("extra", S::kReplicated, extra, /*optional=*/true);
  reg.add("own", S::kOwnRank, own);
  EXPECT_THROW(reg.add("mine", S::kPerRank, extra), Error);
  auto st = reg.snapshot(9, {{"x", 1}});
  EXPECT_EQ(st.step, 9);
  EXPECT_EQ(st.replicated.count("counter"), 1u);
  EXPECT_EQ(st.per_rank.count("mine"), 1u);
  EXPECT_EQ(st.per_rank.count("own"), 1u);
  st.replicated.erase("extra");
  reg.restore(st, "ckpt");
  EXPECT_EQ(loaded, (std::vector<int64_t>{41, 3, -1, 5}));
  loaded.clear();
  st.saved_rank = 0, st.loaded_rank = 1;  // rank 1 reads rank 0's file: the world grew
  reg.restore(st, "ckpt");
  EXPECT_EQ(loaded, (std::vector<int64_t>{41, 3, -1, -1}));
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
