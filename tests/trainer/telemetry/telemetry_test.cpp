// Telemetry and the run record, with the real trainer: meta.json (reproduce), metrics.jsonl and
// TensorBoard (healthy), anomaly evidence and profiler traces (why did it break).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "common/torch/compat.h"
#include "tests/testutil.h"
#include "trainer/telemetry/tensorboard.h"

namespace lm {
namespace {

using test::TempDir;
using json = nlohmann::json;

class TelemetryE2E : public ::testing::Test {
 protected:
  const std::string data_ = test::shared_bytes_dataset();

  test::RunResult train(const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> a = {test::source_path("configs/tiny.yaml"), "data.train=" + data_, "run.dir=" + run,
                                  "eval.batches=2", "train.threads=1"};
    a.insert(a.end(), extra.begin(), extra.end());
    return test::run_bin("trainer", a);
  }
};

json read_json(const std::string& path) { return json::parse(test::read_text(path)); }

TEST_F(TelemetryE2E, MetaJsonRecordsHowToReproduceAndHowItEnded) {
  TempDir run;
  auto r = train(run.path(), {"train.max_steps=6", "log.every_steps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto m = read_json(run / "meta.json");
  EXPECT_EQ(m["format"], "lmtrain-meta");
  EXPECT_EQ(m["status"], "completed");
  EXPECT_EQ(m["exit_code"], 0);
  EXPECT_EQ(m["code"]["commit"].get<std::string>().size(), 40u);
  EXPECT_TRUE(m["code"]["dirty"].is_boolean());
  EXPECT_NE(m["command"].get<std::string>().find("train.max_steps=6"), std::string::npos);
  EXPECT_EQ(m["config"]["train"]["max_steps"], 6);
  EXPECT_EQ(m["config"]["model"]["arch"], "gpt");
  const auto manifest = read_json(data_ + "/manifest.json");
  EXPECT_EQ(m["data"]["data_version"], manifest["data_version"]);
  EXPECT_EQ(m["data"]["tokenizer"]["hash"], manifest["tokenizer"]["hash"]);
  EXPECT_FALSE(m["host"]["hostname"].get<std::string>().empty());
  EXPECT_FALSE(m["host"]["cpu_model"].get<std::string>().empty());
  EXPECT_GE(m["host"]["cpu_cores"].get<int>(), 1);
  EXPECT_TRUE(m["gpu"].is_null());
  EXPECT_FALSE(m["libtorch"].get<std::string>().empty());
  EXPECT_EQ(m["world_size"], 1);
  // The parallelism strategy (Parallelism::record): one process without a group. Checked to fail
  // with the record left out of RunFacts (null).
  EXPECT_EQ(m["parallelism"], json::parse(R"({"strategy": "single"})")) << m["parallelism"];
  EXPECT_FALSE(m["end_time"].is_null());
  // A second, resumed attempt keeps the first one in "attempts".
  ASSERT_EQ(train(run.path(), {"train.max_steps=8", "log.every_steps=2"}).exit_code, 0);
  m = read_json(run / "meta.json");
  ASSERT_EQ(m["attempts"].size(), 1u);
  EXPECT_EQ(m["attempts"][0]["status"], "completed");
}

// dist.invariant: meta.json's parallelism holds the global batch in micro-batches, the tree's padded
// leaves and each rank's block of the global micro-batches (here one rank: all of them). Checked to
// fail with the record left out of RunFacts.
TEST_F(TelemetryE2E, MetaJsonRecordsTheInvariantDeal) {
  TempDir run;
  auto r = train(run.path(), {"train.max_steps=2", "dist.invariant=true", "train.grad_accum=3", "train.micro_batch_size=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto p = read_json(run / "meta.json")["parallelism"];
  ASSERT_TRUE(p.is_object()) << p;
  EXPECT_EQ(p["strategy"], "invariant") << p;
  EXPECT_EQ(p["world_size"], 1) << p;
  EXPECT_EQ(p["global_micro_batches"], 3) << p;
  EXPECT_EQ(p["micro_batch_size"], 2) << p;
  EXPECT_EQ(p["tree_leaves"], 4) << p;
  EXPECT_EQ(p["deal"], json::parse("[[0, 3]]")) << p;
  EXPECT_EQ(p["combine"], "none") << p;
}

TEST_F(TelemetryE2E, StopIsRecorded) {  // failures: see AnomalyEvidenceAndSkippedUpdate
  TempDir stopped;
  auto p = test::spawn_bin("trainer", {test::source_path("configs/tiny.yaml"), "data.train=" + data_,
                                        "run.dir=" + stopped.path(), "train.max_steps=100000", "log.every_steps=1"},
                           stopped / "out");
  ASSERT_TRUE(test::wait_until(p, [&] { return test::last_train_step(stopped / "metrics.jsonl") >= 2; }));
  test::kill_proc(p, SIGTERM);
  ASSERT_EQ(test::wait_proc(p), 0);
  auto m = read_json(stopped / "meta.json");
  EXPECT_EQ(m["status"], "stopped");
  EXPECT_EQ(m["exit_code"], 0);
}

TEST_F(TelemetryE2E, MetricsAndTensorBoardAgree) {
  TempDir run;
  ASSERT_EQ(train(run.path(), {"train.max_steps=12", "log.every_steps=3", "eval.every_steps=6",
                               "log.long_window_s=0.0001", "checkpoint.every_steps=6"}).exit_code, 0);
  std::vector<json> train_recs;
  for (auto& l : test::metrics_of_kind(run / "metrics.jsonl", "train")) train_recs.push_back(json::parse(l));
  ASSERT_EQ(train_recs.size(), 4u);
  for (auto& j : train_recs) {
    for (auto key : {"loss", "lr", "grad_norm", "tokens_per_s", "tokens_per_s_rank", "step_ms", "data_wait_ms",
                     "data_wait_pct", "mem_mb", "tokens", "epoch", "batch_hash", "time"})
      EXPECT_TRUE(j.contains(key)) << key;
    EXPECT_TRUE(j["mfu_pct"].is_number()) << "on CPU: against the SGEMM peak measured at start";
    EXPECT_GT(j["mem_mb"].get<double>(), 1.0);
    ASSERT_TRUE(j["cpu_steal_pct"].is_number()) << "the hypervisor's share over the window (0 on bare metal)";
    EXPECT_GE(j["cpu_steal_pct"].get<double>(), 0.0);
    EXPECT_LE(j["cpu_steal_pct"].get<double>(), 100.0);
  }
  const auto saves = test::metrics_of_kind(run / "metrics.jsonl", "checkpoint");
  ASSERT_EQ(saves.size(), 2u);
  for (auto& l : saves) {
    const json j = json::parse(l);
    ASSERT_TRUE(j.contains("ckpt_steal_ms") && j.at("ckpt_steal_ms").is_number()) << l;
    EXPECT_GE(j.at("ckpt_steal_ms").get<double>(), 0.0);
  }
  EXPECT_GE(test::metrics_of_kind(run / "metrics.jsonl", "window").size(), 3u);  // long-window aggregates
  std::string events;
  for (auto& e : std::filesystem::directory_iterator(run.path()))
    if (e.path().filename().string().rfind("events.out.tfevents.", 0) == 0) events = e.path().string();
  ASSERT_FALSE(events.empty());
  std::map<std::pair<std::string, int64_t>, double> tb;
  for (auto& s : read_tensorboard_scalars(events)) tb[{s.tag, s.step}] = s.value;
  for (auto& j : train_recs)
    EXPECT_FLOAT_EQ(tb.at({"train/loss", j["step"].get<int64_t>()}), j["loss"].get<float>());
  EXPECT_TRUE(tb.count({"val/loss", 6}));
  EXPECT_TRUE(tb.count({"train/cpu_steal_pct", 3}));
  EXPECT_TRUE(tb.count({"checkpoint/steal_ms", 6}));
  EXPECT_TRUE(tb.count({"window/tokens_per_s_mean", 3}) || tb.count({"window/tokens_per_s_mean", 6}));
  // What telemetry cost: the training thread's time building and enqueueing records, and the CPU
  // time of the sink's thread (it wrote 4 train records, a val record and TensorBoard events).
  const auto summary = read_json(run / "summary.json");
  // Timings, so no exact value is known: each is a share of the run's wall time per step (the
  // training thread's telemetry lies inside it; the sink's thread, CPU time, within wall time).
  const double per_step_wall_ms = 1e3 * summary["wall_s"].get<double>() / 12;
  EXPECT_GT(summary["telemetry_ms_per_step"].get<double>(), 0.0);
  EXPECT_LT(summary["telemetry_ms_per_step"].get<double>(), per_step_wall_ms);
  EXPECT_GT(summary["telemetry_sink_cpu_ms_per_step"].get<double>(), 0.0);
  EXPECT_LT(summary["telemetry_sink_cpu_ms_per_step"].get<double>(), per_step_wall_ms);
  EXPECT_EQ(summary["steps"], 12);
  // A configured peak gives an MFU number.
  TempDir run2;
  ASSERT_EQ(train(run2.path(), {"train.max_steps=2", "log.every_steps=1", "log.peak_tflops=1"}).exit_code, 0);
  auto rec = json::parse(test::metrics_of_kind(run2 / "metrics.jsonl", "train").back());
  EXPECT_GT(rec["mfu_pct"].get<double>(), 0.0);  // its exact value: TrainE2E.MfuIsMatmulFlopsOverStepTimeAgainstThePeak
}

// Without validation no val loss is made up: summary.json's val_loss is null and the last line
// says none (it said "val loss -1.0000").
TEST_F(TelemetryE2E, NoValidationWritesNoValLoss) {
  TempDir run;
  auto r = train(run.path(), {"train.max_steps=2", "log.every_steps=1", "eval.batches=0"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const auto summary = read_json(run / "summary.json");
  ASSERT_TRUE(summary.contains("val_loss")) << summary.dump();
  EXPECT_TRUE(summary["val_loss"].is_null()) << summary.dump();
  const size_t done = r.out.find("done: 2 steps");
  ASSERT_NE(done, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("val loss", done), std::string::npos) << r.out;
  // With validation: the number.
  TempDir run2;
  ASSERT_EQ(train(run2.path(), {"train.max_steps=2", "log.every_steps=1"}).exit_code, 0);
  EXPECT_TRUE(read_json(run2 / "summary.json")["val_loss"].is_number());
}

TEST_F(TelemetryE2E, AnomalyEvidenceAndSkippedUpdate) {
  TempDir run;
  // Every step after the warm-up counts as a spike (factor 0.5): updates are skipped, so the
  // weights of step 3 and step 6 are identical, and the batches are kept for replay.
  auto r = train(run.path(), {"train.max_steps=6", "log.every_steps=1", "checkpoint.every_steps=3",
                              "checkpoint.keep_last=0", "anomaly.spike_factor=0.5", "anomaly.warmup_steps=3",
                              "anomaly.window=2", "anomaly.max_dumps=2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(test::read_text(run / "checkpoints/step_00000003/model.safetensors"),
            test::read_text(run / "checkpoints/step_00000006/model.safetensors"));
  EXPECT_EQ(test::metrics_of_kind(run / "metrics.jsonl", "anomaly").size(), 3u);
  const std::string dir = run / "anomalies/step_00000004";
  auto step = read_json(dir + "/step.json");
  EXPECT_NE(step["reason"].get<std::string>().find("loss spike"), std::string::npos);
  EXPECT_EQ(step["action"], "skip");
  auto batch = read_json(dir + "/rank_0.json");
  EXPECT_EQ(batch["data_version"], read_json(data_ + "/manifest.json")["data_version"]);
  auto row = batch["micro_batches"][0]["rows"][0];
  EXPECT_EQ(row["inputs"].size(), 64u);
  EXPECT_EQ(row["shard_file"].get<std::string>().rfind("train_", 0), 0u);
  EXPECT_TRUE(row.contains("doc") && row.contains("offset"));
  EXPECT_FALSE(std::filesystem::exists(run / "anomalies/step_00000006"));  // max_dumps
  // action=stop: a checkpoint, then exit 1 naming the anomaly.
  TempDir stop;
  r = train(stop.path(), {"train.max_steps=20", "anomaly.spike_factor=0.5", "anomaly.warmup_steps=3",
                          "anomaly.window=2", "anomaly.action=stop"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("stopped at step 4 by an anomaly"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::exists(stop / "checkpoints/step_00000004/manifest.json"));
  EXPECT_EQ(read_json(stop / "meta.json")["status"], "failed");
}

// log.profile_steps=2-3: the Chrome trace of steps 2..3 holds their ops (Kineto's trace where
// LibTorch has it, else the legacy recorder's event array), and top.json the CPU ops that took the
// time: sorted by time, shares of at most 100% together, names that occur in the trace.
TEST_F(TelemetryE2E, ProfilerTraceOfChosenSteps) {
  TempDir run;
  auto r = train(run.path(), {"train.max_steps=5", "log.profile_steps=2-3"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto trace = json::parse(test::read_text(run / "profile/steps_2-3.rank0.trace.json"));
  json events = trace;
  if (compat::kHasKineto) {  // Kineto's format: {"traceEvents": [...], "deviceProperties": ...}, ops "cpu_op"
    ASSERT_TRUE(trace.is_object());
    EXPECT_TRUE(trace.contains("deviceProperties"));
    events = trace["traceEvents"];
  }
  ASSERT_TRUE(events.is_array());
  std::set<std::string> names;
  size_t ops = 0;
  bool matmul = false;
  for (auto& ev : events) {
    if (ev.value("ph", "") != "X") continue;
    const std::string name = ev.value("name", "");
    names.insert(name);
    if (name.rfind("aten::", 0) != 0) continue;
    ++ops;
    if (compat::kHasKineto) {
      EXPECT_EQ(ev.value("cat", ""), "cpu_op") << name;
    }
    matmul |= (name == "aten::mm" || name == "aten::addmm" || name == "aten::linear") && ev.value("dur", 0.0) > 0;
  }
  EXPECT_GT(ops, 50u);
  EXPECT_TRUE(matmul);
  auto top = read_json(run / "profile/steps_2-3.rank0.top.json");
  EXPECT_EQ(top["device"], "cpu");
  EXPECT_EQ(top["steps"], json::array({2, 3}));
  EXPECT_NE(top["window"].get<std::string>().find("self time"), std::string::npos);
  const double total = top["total_us"].get<double>();
  ASSERT_FALSE(top["top"].empty());
  EXPECT_LE(top["top"].size(), 30u);
  double pct = 0, prev = total;
  for (auto& t : top["top"]) {
    const std::string name = t["name"];
    EXPECT_TRUE(names.count(name)) << name;
    EXPECT_GE(t["calls"].get<int64_t>(), 1) << name;
    EXPECT_LE(t["total_us"].get<double>(), prev) << name;  // sorted, the largest first
    prev = t["total_us"].get<double>();
    // pct is floor(us / total * 1e4) / 100 (trainer/telemetry/profiler.cpp): cut below by less
    // than 0.01, plus double roundings (~1e-14); the bound is twice the cut.
    EXPECT_NEAR(t["pct"].get<double>(), 100 * prev / total, 0.02) << name;
    pct += t["pct"].get<double>();
  }
  EXPECT_GT(top["top"][0]["total_us"].get<double>(), 0);
  EXPECT_LE(pct, 100.0);
  EXPECT_GT(pct, 50.0);
  EXPECT_NE(r.out.find(std::string("profile: steps 2-3 in ") + (run / "profile/steps_2-3.rank0.trace.json")),
            std::string::npos) << r.out;
  for (auto& f : std::filesystem::directory_iterator(run / "profile"))  // no temp file left
    EXPECT_EQ(f.path().string().find(".tmp."), std::string::npos) << f.path();
  EXPECT_EQ(train(run.path() + "_bad", {"log.profile_steps=3-1"}).exit_code, 2);
}

// A trace that cannot be written costs the trace, not the run: a warning, the run goes on to its end.
TEST_F(TelemetryE2E, AnUnwritableTraceDoesNotStopTheRun) {
  TempDir run;
  std::filesystem::create_directories(run / "profile/steps_2-3.rank0.trace.json/blocked");  // rename target: a dir
  auto r = train(run.path(), {"train.max_steps=5", "log.profile_steps=2-3"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("profile: steps 2-3 not written: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("done: 5 steps"), std::string::npos) << r.out;
  for (auto& f : std::filesystem::directory_iterator(run / "profile"))  // no temp file left
    EXPECT_EQ(f.path().string().find(".tmp."), std::string::npos) << f.path();
}

}  // namespace
}  // namespace lm

namespace lm {
namespace {

// On a terminal the console gets a progress bar with ETA under the step lines; in a pipe it gets
// plain lines only.
TEST_F(TelemetryE2E, ProgressBarOnlyOnATerminal) {
  TempDir run, piped;
  std::string cmd = "'" + test::bin_path("trainer") + "' '" + test::source_path("configs/tiny.yaml") + "' 'data.train=" +
                    data_ + "' 'run.dir=" + run.path() + "' train.max_steps=20 log.every_steps=5 eval.batches=0";
  // script(1) runs the command with a pseudo-terminal as its stdin/stdout/stderr.
  auto tty = test::run_bin("/usr/bin/script", {"-q", "-e", "-c", cmd, run / "typescript"});
  ASSERT_EQ(tty.exit_code, 0) << tty.out;
  const std::string seen = test::read_text(run / "typescript");
  EXPECT_NE(seen.find("] 100% step 20/20 | ETA"), std::string::npos) << seen;
  auto plain = train(piped.path(), {"train.max_steps=20", "log.every_steps=5"});
  ASSERT_EQ(plain.exit_code, 0);
  EXPECT_EQ(plain.out.find("ETA"), std::string::npos);
  EXPECT_NE(plain.out.find("step     20/20 | loss"), std::string::npos);
}

}  // namespace
}  // namespace lm

namespace lm {
namespace {

// After the first steps (past step 1's warm-up) the log says once how long the run will take: the
// steps left, at the mean step time measured, near the time the remaining steps really took. A
// run too short to measure says nothing.
TEST_F(TelemetryE2E, EstimatedTimeToMaxStepsAfterTheFirstSteps) {
  TempDir run, short_run;
  // One thread: two trainers of ctest -j2 on two cores, each with a thread per core, slowed steps
  // 2-6 5.5x against the later ones in one CI run (the estimate's window is a few steps long).
  auto r = train(run.path(), {"train.max_steps=16", "log.every_steps=4", "eval.batches=0", "train.threads=1"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  const std::string key = "estimated time to train.max_steps=16 on this machine: ";
  const size_t at = r.out.find(key);
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_EQ(r.out.find(key, at + 1), std::string::npos) << "once";
  long long left = 0, first = 0, last = 0, warm = 0;
  double ms = 0;
  const std::string line = r.out.substr(at, r.out.find('\n', at) - at);
  const size_t paren = line.find('(');
  ASSERT_NE(paren, std::string::npos) << line;
  ASSERT_EQ(std::sscanf(line.c_str() + paren, "(%lld steps left at %lf ms/step, the mean of steps %lld-%lld, after step %lld's",
                        &left, &ms, &first, &last, &warm), 5)
      << line;
  EXPECT_EQ(first, 2) << line;
  EXPECT_EQ(last, 6) << line;
  EXPECT_EQ(warm, 1) << line;
  EXPECT_EQ(left, 10) << line;
  EXPECT_GT(ms, 0.0) << line;
  // The steps' own mean step time (metrics.jsonl windows after the first) against the estimate's:
  // the same order of magnitude on a shared host (a factor of 10 either way).
  double sum_ms = 0;
  int n = 0;
  std::ifstream in(run / "metrics.jsonl");
  for (std::string l; std::getline(in, l);) {
    auto j = json::parse(l);
    if (j.value("kind", "") == "train" && j.value("step", 0) > 4) sum_ms += j["step_ms"].get<double>(), ++n;
  }
  ASSERT_GT(n, 0);
  EXPECT_LT(ms, 10 * sum_ms / n) << line;
  EXPECT_GT(ms, sum_ms / n / 10) << line;
  auto s = train(short_run.path(), {"train.max_steps=3", "eval.batches=0"});
  ASSERT_EQ(s.exit_code, 0) << s.out;
  EXPECT_EQ(s.out.find("estimated time to"), std::string::npos) << s.out;
}

}  // namespace
}  // namespace lm
