// Tests of build/bin/sweep: expansion and run names (--dry-run), bad sweep files and bad run configs
// rejected before anything runs, and real sweeps of the real trainer on a tiny bytes dataset: K at
// a time with the cores split, a failing run recorded while the others run, a rerun that skips
// finished runs and resumes one whose trainer was SIGKILLed, a SIGTERM to the sweep, and a run
// through build/bin/launch when that binary is built.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testutil.h"

namespace lm {
namespace {

namespace fs = std::filesystem;
using test::read_text;
using test::RunResult;
using test::TempDir;
using test::write_text;

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// Table rows of `sweep --dry-run`: "   N  NAME  STATE  OVERRIDES".
struct Row {
  std::string name, state;
};
std::vector<Row> dry_rows(const std::string& out) {
  std::vector<Row> rows;
  std::regex re(R"(^\s+\d+\s+(\S+)\s+(\S+)\s+.*$)");
  for (auto& l : lines_of(out)) {
    std::smatch m;
    if (std::regex_match(l, m, re)) rows.push_back({m[1], m[2]});
  }
  return rows;
}

// summary.csv as rows of columns (no quoting in these tests' values).
std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  for (auto& l : lines_of(read_text(path))) {
    std::vector<std::string> cols;
    std::stringstream ss(l);
    for (std::string c; std::getline(ss, c, ',');) cols.push_back(c);
    if (!l.empty() && l.back() == ',') cols.push_back("");
    rows.push_back(cols);
  }
  return rows;
}
std::string col(const std::vector<std::vector<std::string>>& csv, size_t row, const std::string& name) {
  auto it = std::find(csv[0].begin(), csv[0].end(), name);
  EXPECT_NE(it, csv[0].end()) << name;
  if (it == csv[0].end() || row >= csv.size()) return "";
  size_t i = static_cast<size_t>(it - csv[0].begin());
  return i < csv[row].size() ? csv[row][i] : "";
}

nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(read_text(path)); }

int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return -1;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

class Sweep : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    shared_ = new TempDir();
    data_ = test::make_bytes_dataset(shared_->path(), 1500);
  }
  static void TearDownTestSuite() { delete shared_; }

  // A tiny base config: a step takes milliseconds on CPU.
  std::string base(int max_steps = 8) {
    const std::string p = tmp_ / "base.yaml";
    write_text(p, "run: {dir: runs/unused, seed: 1}\n"
                  "data: {train: " + data_ + "}\n"
                  "model: {n_layer: 1, n_head: 2, d_model: 32, seq_len: 32}\n"
                  "optim: {lr: 3.0e-3}\n"
                  "schedule: {warmup_steps: 2}\n"
                  "train: {max_steps: " + std::to_string(max_steps) + ", micro_batch_size: 4}\n"
                  "log: {every_steps: 2}\n"
                  "eval: {every_steps: 4, batches: 2}\n");
    return p;
  }
  // Writes a sweep file with `dir` = tmp/sw and the given body; returns its path.
  std::string sweep_file(const std::string& body, const std::string& name = "sweep.yaml") {
    const std::string p = tmp_ / name;
    write_text(p, "dir: " + dir() + "\n" + body);
    return p;
  }
  std::string dir() const { return tmp_ / "sw"; }
  RunResult sweep(const std::vector<std::string>& args) { return test::run_bin("sweep", args); }

  static TempDir* shared_;
  static std::string data_;
  TempDir tmp_;
};
TempDir* Sweep::shared_ = nullptr;
std::string Sweep::data_;

TEST_F(Sweep, DryRunExpandsGridZipSeedsWithStableNames) {
  const std::string f = sweep_file("base: " + base() + "\n"
                                   "overrides: {train.max_steps: 5}\n"
                                   "grid: {optim.lr: [1e-3, 3e-3], model: {d_model: [32, 64, 128]}}\n"
                                   "zip: {model.n_head: [2, 4], model.n_layer: [1, 2]}\n"
                                   "seeds: [1, 2]\n");
  auto r = sweep({f, "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto rows = dry_rows(r.out);
  ASSERT_EQ(rows.size(), 2u * 3 * 2 * 2) << r.out;
  // File order: first grid key slowest, then the zip rows, seeds fastest.
  EXPECT_EQ(rows[0].name, "lr=1e-3_d_model=32_n_head=2_n_layer=1_seed=1");
  EXPECT_EQ(rows[1].name, "lr=1e-3_d_model=32_n_head=2_n_layer=1_seed=2");
  EXPECT_EQ(rows[2].name, "lr=1e-3_d_model=32_n_head=4_n_layer=2_seed=1");
  EXPECT_EQ(rows[4].name, "lr=1e-3_d_model=64_n_head=2_n_layer=1_seed=1");
  EXPECT_EQ(rows[23].name, "lr=3e-3_d_model=128_n_head=4_n_layer=2_seed=2");
  for (auto& row : rows) EXPECT_EQ(row.state, "new");
  std::set<std::string> names;
  for (auto& row : rows) names.insert(row.name);
  EXPECT_EQ(names.size(), rows.size());
  EXPECT_NE(r.out.find("train.max_steps=5"), std::string::npos) << r.out;
  // Stable: the same file gives the same table; nothing was created.
  EXPECT_EQ(sweep({f, "--dry-run"}).out, r.out);
  EXPECT_FALSE(fs::exists(dir()));
}

TEST_F(Sweep, DryRunNamesSharedLeavesLongAndCollidingValues) {
  const std::string long_path = "/data/" + std::string(120, 'x');
  const std::string f = sweep_file("base: " + base() + "\n"
                                   "grid: {log.every_steps: [1], eval.every_steps: [2, 4]}\n"
                                   "zip: {data.val: ['a/b', 'a:b', '" + long_path + "']}\n");
  auto r = sweep({f, "--dry-run"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto rows = dry_rows(r.out);
  ASSERT_EQ(rows.size(), 6u) << r.out;
  std::regex hashed(R"(^log\.every_steps=1_eval\.every_steps=2_val=a-b_[0-9a-f]{8}$)");
  EXPECT_TRUE(std::regex_match(rows[0].name, hashed)) << rows[0].name;  // 'a/b' and 'a:b' collide
  EXPECT_TRUE(std::regex_match(rows[1].name, hashed)) << rows[1].name;
  EXPECT_NE(rows[0].name, rows[1].name);
  EXPECT_LE(rows[2].name.size(), 96u) << rows[2].name;  // long: cut, with a hash
  EXPECT_TRUE(std::regex_search(rows[2].name, std::regex("_[0-9a-f]{8}$"))) << rows[2].name;
  std::set<std::string> names;
  for (auto& row : rows) {
    names.insert(row.name);
    EXPECT_TRUE(std::regex_match(row.name, std::regex(R"([A-Za-z0-9._+=-]+)"))) << row.name;
  }
  EXPECT_EQ(names.size(), 6u);
}

TEST_F(Sweep, BadSweepFilesAndRunConfigsExit2BeforeAnyRun) {
  const std::string b = "base: " + base() + "\n";
  struct Case {
    std::string body, expect;
  };
  const std::vector<Case> cases = {
      {b + "grdi: {optim.lr: [1e-3]}\n", "unknown key 'grdi' (did you mean 'grid'?)"},
      {b + "zip: {model.n_head: [2, 4], model.n_layer: [1]}\n", "zip lists must have the same length"},
      {b + "grid: {optim.lr: []}\n", "empty list"},
      {b + "grid: {}\n", "grid: empty"},
      {b + "seeds: []\n", "seeds: empty list"},
      {b + "overrides: {train.max_steps: 3}\n", "nothing to sweep"},
      {b + "grid: {optim.lr: 1e-3}\n", "expected a list of values"},
      {b + "grid: {optim.lr: [1e-3, 1e-3]}\n", "appears twice"},
      {b + "overrides: {run.dir: x}\ngrid: {optim.lr: [1e-3]}\n", "run.dir is set by the sweep"},
      {b + "overrides: {optim.lr: 1}\ngrid: {optim.lr: [1e-3]}\n", "set by both overrides and grid"},
      {"base: /nonexistent/base.yaml\nseeds: [1]\n", "no such file"},
      {b + "grid: {optim.lrr: [1e-3, 3e-3]}\n", "run lrr=1e-3: override 'optim.lrr=1e-3': unknown key 'optim.lrr' (did you mean 'optim.lr'?)"},
      {b + "grid: {optim.lr: [1e-3, -1]}\n", "run lr=-1: override 'optim.lr=-1': key 'optim.lr': must be in (0, inf)"},
      {b + "grid: {model.d_model: [32, 33]}\n", "run d_model=33: key 'model.d_model': 33 is not divisible"},
      {b + "seeds: [1, x]\n", "run seed=x: override 'run.seed=x'"},
      {b + "seeds: [1]\nlaunch: {nproc_per_nod: 2}\n", "did you mean 'nproc_per_node'?"},
      {b + "seeds: [1]\nlaunch: {nnodes: 2}\n", "multi-node sweeps are not supported"},
      {b + "seeds: [1]\nlaunch: {rdzv-endpoint: \"h:1\"}\n", "multi-node sweeps are not supported"},
      {b + "seeds: [1]\n---\ngrid: {optim.lr: [1e-3]}\n", "sweep.yaml:4: a second YAML document ('---'); a sweep file holds one document"},
  };
  for (auto& c : cases) {
    auto r = sweep({sweep_file(c.body)});
    EXPECT_EQ(r.exit_code, 2) << c.body << r.out;
    EXPECT_NE(r.out.find(c.expect), std::string::npos) << c.body << "\n---\n" << r.out;
    EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
    EXPECT_FALSE(fs::exists(dir())) << c.body;
  }
  auto r = sweep({tmp_ / "missing.yaml"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(tmp_ / "missing.yaml" + ": cannot open sweep file"), std::string::npos) << r.out;
  EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
  fs::create_directories(tmp_ / "adir");  // was "basic_filebuf::underflow error reading the file: Is a directory"
  r = sweep({tmp_ / "adir"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_NE(r.out.find(tmp_ / "adir" + ": is a directory, expected a YAML sweep file"), std::string::npos) << r.out;
  r = sweep({sweep_file(b + "seeds: [1]\n"), "--parallel", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_FALSE(fs::exists(dir()));
}

TEST_F(Sweep, ParallelSweepRunsSplitsCoresAndWritesSummaries) {
  const std::string f = sweep_file("base: " + base() + "\n"
                                   "overrides: {optim.weight_decay: 0.0}\n"
                                   "grid: {optim.lr: [1e-4, 1e-2]}\n");
  auto r = sweep({f, "--parallel", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const int threads = std::max(1, CPU_COUNT(&set) / 2);
  for (std::string name : {"lr=1e-4", "lr=1e-2"}) {
    const std::string run = dir() + "/" + name;
    ASSERT_TRUE(fs::exists(run + "/summary.json")) << r.out;
    EXPECT_EQ(read_json(run + "/summary.json")["steps"], 8);
    const std::string cfg = read_text(run + "/config.yaml");
    EXPECT_NE(cfg.find("dir: " + run), std::string::npos) << cfg;
    EXPECT_NE(cfg.find("threads: " + std::to_string(threads)), std::string::npos) << cfg;
    EXPECT_NE(read_text(run + "/sweep.log").find("==== sweep"), std::string::npos);
    EXPECT_NE(read_text(run + "/sweep.log").find("done: 8 steps"), std::string::npos);
  }
  // Both runs started before either finished.
  auto out = lines_of(r.out);
  int starts_before_done = 0;
  for (auto& l : out) {
    if (l.find(" done  ") != std::string::npos) break;
    starts_before_done += l.find(" start ") != std::string::npos;
  }
  EXPECT_EQ(starts_before_done, 2) << r.out;
  // Summaries: sorted by best validation loss (lr=1e-2 learns faster in 8 steps).
  auto csv = read_csv(dir() + "/summary.csv");
  ASSERT_EQ(csv.size(), 3u) << read_text(dir() + "/summary.csv");
  EXPECT_EQ(csv[0][0], "run");
  EXPECT_EQ(col(csv, 1, "run"), "lr=1e-2");
  EXPECT_EQ(col(csv, 1, "optim.lr"), "1e-2");
  EXPECT_EQ(col(csv, 2, "run"), "lr=1e-4");
  EXPECT_LT(std::stod(col(csv, 1, "best_val_loss")), std::stod(col(csv, 2, "best_val_loss")));
  for (size_t i : {1u, 2u}) {
    EXPECT_EQ(col(csv, i, "status"), "done");
    EXPECT_EQ(col(csv, i, "exit_code"), "0");
    EXPECT_EQ(col(csv, i, "steps"), "8");
    // The row's numbers are its run's records (metrics.jsonl): the last train record's loss, the
    // lowest val_loss, the mean tokens/s of the train records after the first (summary.md's rule).
    const std::string run = col(csv, i, "run_dir");
    double last_loss = NAN, best_val = NAN, tps_sum = 0;
    int tps_n = -1;  // the first window is left out
    for (auto& l : lines_of(read_text(run + "/metrics.jsonl"))) {
      const auto j = nlohmann::json::parse(l);
      if (j["kind"] == "train") {
        last_loss = j["loss"].get<double>();
        if (++tps_n > 0) tps_sum += j["tokens_per_s"].get<double>();
      } else if (j["kind"] == "val" && !(j["val_loss"].get<double>() >= best_val)) {
        best_val = j["val_loss"].get<double>();
      }
    }
    ASSERT_GT(tps_n, 0) << "train records after the first";
    // The CSV prints the losses with %.6g: half a unit of the 6th digit, at most 5e-6 of the value
    // (a leading 1); the bound is twice that. tokens/s with %.1f: 0.05, plus the mean's double
    // roundings (the same <= 8 parsed values summed, maybe in another order: ~1e-15 relative).
    EXPECT_NEAR(std::stod(col(csv, i, "final_train_loss")), last_loss, 1e-5 * last_loss) << run;
    EXPECT_NEAR(std::stod(col(csv, i, "best_val_loss")), best_val, 1e-5 * best_val) << run;
    EXPECT_NEAR(std::stod(col(csv, i, "mean_tokens_per_s")), tps_sum / tps_n, 0.05 + 1e-12 * tps_sum / tps_n) << run;
    EXPECT_EQ(col(csv, i, "steps"), std::to_string(read_json(run + "/summary.json")["steps"].get<int64_t>()));
  }
  const std::string md = read_text(dir() + "/summary.md");
  EXPECT_NE(md.find("| lr=1e-2 | 1e-2 | done | 8/8 |"), std::string::npos) << md;
  EXPECT_LT(md.find("lr=1e-2 |"), md.find("lr=1e-4 |"));
  EXPECT_EQ(read_text(dir() + "/sweep.yaml"), read_text(f));
  if (fs::exists(test::bin_path("report")))
    EXPECT_TRUE(fs::exists(dir() + "/report.html")) << r.out;
  else
    EXPECT_NE(r.out.find("skipping report.html"), std::string::npos) << r.out;

  // Dry run now shows them done; a changed fixed override is refused (the results would be
  // reported under the new config), naming the key; nothing runs.
  auto d = sweep({f, "--dry-run"});
  ASSERT_EQ(d.exit_code, 0) << d.out;
  for (auto& row : dry_rows(d.out)) EXPECT_EQ(row.state, "done");
  const int64_t t = mtime_ns(dir() + "/lr=1e-4/summary.json");
  const std::string changed = sweep_file("base: " + base() + "\n"
                                         "overrides: {optim.weight_decay: 0.5}\n"
                                         "grid: {optim.lr: [1e-4, 1e-2]}\n", "changed.yaml");
  auto c = sweep({changed});
  EXPECT_EQ(c.exit_code, 2) << c.out;
  EXPECT_NE(c.out.find("optim.weight_decay 0 -> 0.5"), std::string::npos) << c.out;
  EXPECT_EQ(mtime_ns(dir() + "/lr=1e-4/summary.json"), t);
}

TEST_F(Sweep, FailingRunIsRecordedAndTheOthersRun) {
  const std::string f = sweep_file("base: " + base(4) + "\n"
                                   "grid: {data.train: [" + tmp_ / "no_such_data" + ", " + data_ + "]}\n");
  auto r = sweep({f});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  auto rows = dry_rows(sweep({f, "--dry-run"}).out);
  ASSERT_EQ(rows.size(), 2u);
  const std::string bad = dir() + "/" + rows[0].name, good = dir() + "/" + rows[1].name;
  EXPECT_NE(r.out.find("FAIL  " + rows[0].name + ": exit 2"), std::string::npos) << r.out;
  const std::string log = read_text(bad + "/sweep.log");
  EXPECT_NE(log.find("trainer: error:"), std::string::npos) << log;
  EXPECT_NE(log.find("no_such_data"), std::string::npos) << log;
  EXPECT_NE(log.find("==== sweep"), std::string::npos) << log;
  EXPECT_NE(log.find(": exit 2 after"), std::string::npos) << log;
  EXPECT_EQ(read_json(good + "/summary.json")["steps"], 4);
  auto csv = read_csv(dir() + "/summary.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(col(csv, 1, "run"), rows[1].name);  // with a validation loss: first
  EXPECT_EQ(col(csv, 1, "status"), "done");
  EXPECT_EQ(col(csv, 2, "run"), rows[0].name);
  EXPECT_EQ(col(csv, 2, "status"), "failed");
  EXPECT_EQ(col(csv, 2, "exit_code"), "2");
  EXPECT_EQ(col(csv, 2, "best_val_loss"), "");
  EXPECT_NE(read_text(dir() + "/summary.md").find("failed (exit 2)"), std::string::npos);
}

// Waits for "start NAME (..., pid N)" in the sweep's output; returns N (or -1).
int trainer_pid(const test::Proc& p, const std::string& name) {
  int pid = -1;
  test::wait_until(p, [&] {
    const std::string out = read_text(p.log);
    auto at = out.find("start " + name + " (");
    auto pid_at = at == std::string::npos ? at : out.find("pid ", at);
    if (pid_at != std::string::npos && out.find(')', pid_at) != std::string::npos) pid = std::stoi(out.substr(pid_at + 4));
    return pid > 0;
  }, 60);
  return pid;
}

bool has_checkpoint(const std::string& run) {
  std::error_code ec;
  for (auto& e : fs::directory_iterator(run + "/checkpoints", ec))
    if (std::regex_match(e.path().filename().string(), std::regex(R"(step_\d+)")) && fs::exists(e.path() / "manifest.json"))
      return true;
  return false;
}

TEST_F(Sweep, RerunSkipsFinishedRunsAndResumesAKilledOne) {
  const std::string f = sweep_file("base: " + base() + "\n"
                                   "overrides: {train.max_steps: 400, checkpoint.every_steps: 10, log.every_steps: 1,\n"
                                   "            eval.every_steps: 0, eval.batches: 1}\n"
                                   "seeds: [1, 2]\n");
  auto p = test::spawn_bin("sweep", {f}, tmp_ / "sweep1.out");
  const int pid = trainer_pid(p, "seed=1");
  ASSERT_GT(pid, 0) << read_text(p.log);
  const std::string run1 = dir() + "/seed=1", run2 = dir() + "/seed=2";
  ASSERT_TRUE(test::wait_until(p, [&] { return has_checkpoint(run1); }, 60)) << read_text(p.log);
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  EXPECT_EQ(test::wait_proc(p, 120), 1) << read_text(p.log);
  const std::string out1 = read_text(p.log);
  EXPECT_NE(out1.find("FAIL  seed=1: SIGKILL"), std::string::npos) << out1;
  EXPECT_FALSE(fs::exists(run1 + "/summary.json"));
  ASSERT_EQ(read_json(run2 + "/summary.json")["steps"], 400) << out1;  // the other run still ran
  auto csv = read_csv(dir() + "/summary.csv");
  EXPECT_EQ(col(csv, 2, "run"), "seed=1");
  EXPECT_EQ(col(csv, 2, "status"), "failed");
  EXPECT_EQ(col(csv, 2, "exit_code"), std::to_string(128 + SIGKILL));

  auto rows = dry_rows(sweep({f, "--dry-run"}).out);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].state.rfind("resume@", 0), 0u) << rows[0].state;
  EXPECT_EQ(rows[1].state, "done");

  const int64_t t_summary = mtime_ns(run2 + "/summary.json"), t_metrics = mtime_ns(run2 + "/metrics.jsonl");
  const std::string log2 = read_text(run2 + "/sweep.log");
  auto r = sweep({f});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("skip  seed=2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("start seed=1 (resume@"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(run1 + "/summary.json")["steps"], 400);
  EXPECT_EQ(test::metrics_of_kind(run1 + "/metrics.jsonl", "resume").size(), 1u);
  EXPECT_NE(read_text(run1 + "/sweep.log").find("resume from step"), std::string::npos);
  EXPECT_EQ(mtime_ns(run2 + "/summary.json"), t_summary);
  EXPECT_EQ(mtime_ns(run2 + "/metrics.jsonl"), t_metrics);
  EXPECT_EQ(read_text(run2 + "/sweep.log"), log2);
  csv = read_csv(dir() + "/summary.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(col(csv, 1, "status"), "done");
  EXPECT_EQ(col(csv, 2, "status"), "done");
  EXPECT_EQ(col(csv, 2, "steps"), "400");
}

TEST_F(Sweep, SigtermStopsTheSweepAndTheNextOneResumes) {
  const std::string f = sweep_file("base: " + base() + "\n"
                                   "overrides: {train.max_steps: 400, checkpoint.every_steps: 1000, log.every_steps: 1,\n"
                                   "            eval.every_steps: 0, eval.batches: 1}\n"
                                   "seeds: [1, 2]\n");
  auto p = test::spawn_bin("sweep", {f}, tmp_ / "sweep1.out");
  ASSERT_GT(trainer_pid(p, "seed=1"), 0) << read_text(p.log);
  const std::string run1 = dir() + "/seed=1";
  ASSERT_TRUE(test::wait_until(p, [&] { return test::last_train_step(run1 + "/metrics.jsonl") >= 5; }, 60))
      << read_text(p.log);
  test::kill_proc(p, SIGTERM);
  EXPECT_EQ(test::wait_proc(p, 120), 128 + SIGTERM) << read_text(p.log);
  const std::string out = read_text(p.log);
  EXPECT_NE(out.find("stopped seed=1"), std::string::npos) << out;
  EXPECT_EQ(out.find("start seed=2"), std::string::npos) << out;  // no new run after the signal
  EXPECT_TRUE(has_checkpoint(run1));                              // the trainer checkpointed
  auto csv = read_csv(dir() + "/summary.csv");
  ASSERT_EQ(csv.size(), 3u);
  EXPECT_EQ(col(csv, 1, "status"), "stopped");
  EXPECT_EQ(col(csv, 2, "status"), "pending");

  auto r = sweep({f});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("start seed=1 (resume@"), std::string::npos) << r.out;
  EXPECT_EQ(read_json(run1 + "/summary.json")["steps"], 400);
  EXPECT_EQ(read_json(dir() + "/seed=2/summary.json")["steps"], 400);
}

TEST_F(Sweep, RunsThroughLaunchWhenBuilt) {
  if (!fs::exists(test::bin_path("launch"))) GTEST_SKIP() << "build/bin/launch is not built";
  const std::string f = sweep_file("base: " + base(4) + "\n"
                                   "overrides: {dist.timeout_s: 60}\n"
                                   "seeds: [3]\n"
                                   "launch: {nproc_per_node: 2, max_restarts: 0}\n");
  auto r = sweep({f});
  ASSERT_EQ(r.exit_code, 0) << r.out << read_text(dir() + "/seed=3/sweep.log");
  auto sum = read_json(dir() + "/seed=3/summary.json");
  EXPECT_EQ(sum["steps"], 4);
  EXPECT_EQ(sum["world_size"], 2);
  EXPECT_NE(read_text(dir() + "/seed=3/sweep.log").find("--standalone"), std::string::npos);
  EXPECT_TRUE(fs::exists(dir() + "/seed=3/launch_logs"));
}

}  // namespace
}  // namespace lm
