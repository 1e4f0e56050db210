// The trainer on remote datasets, in real processes, against nginx and the fault-injecting proxy
// (remote_servers.h): faults and an outage are ridden out with the local run's exact batches; a
// fault longer than data.remote_timeout_s ends the run after a checkpoint and a rerun resumes it, a
// 403 mid-run too (exit 2, with the weights);
// a cache too small fails at start; two runs share one cache. Skipped, saying why, without nginx.
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <map>
#include <string>
#include <utility>

#include "tests/remote_servers.h"
#include "tests/testutil.h"
#include "run/run_dir.h"

namespace lm {
namespace {

using test::TempDir;
using Hashes = std::map<int64_t, std::string>;  // step -> batch_hash

double outage_s() {
  const char* v = std::getenv("LM_REMOTE_OUTAGE_S");
  return v ? std::atof(v) : 3.0;
}

class RemoteTrainTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::find_nginx().empty()) GTEST_SKIP() << "SKIPPED: nginx not found (Debian nginx-light; launch/dev/deps.sh installs it)";
  }

  // A tiny trainer config (a step takes milliseconds) logging every step's batch hash.
  std::string config(const std::string& name, const std::string& train, const std::string& extra, int steps,
                     int seed = 1) {
    const std::string p = tmp_ / (name + ".yaml");
    test::write_text(p, "run: {dir: " + (tmp_ / ("runs/" + name)) + ", seed: " + std::to_string(seed) + "}\n"
                        "data: {train: '" + train + "', shuffle_buffer: 64, cache_dir: " + (tmp_ / "cache") +
                        (extra.empty() ? "" : ", " + extra) + "}\n"
                        "model: {n_layer: 1, n_head: 2, d_model: 32, seq_len: 32}\n"
                        "optim: {lr: 3.0e-3}\nschedule: {warmup_steps: 2}\n"
                        "train: {max_steps: " + std::to_string(steps) + ", micro_batch_size: 4}\n"
                        "log: {every_steps: 1}\neval: {batches: 0}\n");
    return p;
  }
  Hashes batch_hashes(const std::string& name) {
    return test::step_batch_hashes(run_dir::metrics(tmp_ / ("runs/" + name)));
  }
  nlohmann::json proxy_stats() { return nlohmann::json::parse(test::read_text(tmp_ / "proxy_stats.json")); }
  std::string url(int port) { return "http://127.0.0.1:" + std::to_string(port) + "/data"; }

  TempDir tmp_;
};

// 5% of the requests fail (drop, stall, truncate, 503) and one outage of LM_REMOTE_OUTAGE_S
// seconds: the run completes with the local run's batches, step by step.
TEST_F(RemoteTrainTest, TrainThroughFaultsEqualsLocal) {
  const std::string data = test::make_dataset(tmp_.path(), 3000, 2000);
  auto nginx = test::start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  const double out = outage_s();
  auto proxy = test::start_proxy(nginx->port, tmp_.path(),
                                 {"--fail", "0.05", "--outage-after", "15", "--outage-s", std::to_string(out),
                                  "--stall-s", "1", "--seed", "3"});
  ASSERT_TRUE(proxy->up());
  const int steps = 400;  // 16 rows of 32 tokens: more than an epoch, every shard is fetched
  auto local = test::run_bin("trainer", {config("local", data, "", steps), "train.micro_batch_size=16"});
  ASSERT_EQ(local.exit_code, 0) << local.out;
  auto remote = test::run_bin("trainer", {config("remote", url(proxy->port), "remote_timeout_s: " + std::to_string(out + 30), steps),
                                          "train.micro_batch_size=16"});
  ASSERT_EQ(remote.exit_code, 0) << remote.out;
  const Hashes want = batch_hashes("local");
  EXPECT_EQ(want.size(), static_cast<size_t>(steps));
  EXPECT_EQ(batch_hashes("remote"), want);
  const auto st = proxy_stats();
  EXPECT_GT(st.at("outage").get<int>(), 0) << st.dump();
  EXPECT_GT(st.at("drop").get<int>() + st.at("stall").get<int>() + st.at("truncate").get<int>() + st.at("503").get<int>(), 0)
      << st.dump();
  const auto meta = nlohmann::json::parse(test::read_text(run_dir::meta(tmp_ / "runs/remote")));
  EXPECT_EQ(meta.at("data").at("sources").at(0).at("location"), url(proxy->port));
  EXPECT_EQ(meta.at("data").at("sources").at(0).at("kind"), "http");
}

// An outage longer than data.remote_timeout_s: exit 1 with one line naming the URL, after a
// checkpoint; the rerun (straight to nginx) resumes there, and the whole run has the local batches.
TEST_F(RemoteTrainTest, OutageLongerThanTimeoutCheckpointsAndResumes) {
  const std::string data = test::make_dataset(tmp_.path(), 3000, 2000);
  auto nginx = test::start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  auto proxy = test::start_proxy(nginx->port, tmp_.path(), {"--fail", "0", "--outage-after", "20", "--outage-s", "1000"});
  ASSERT_TRUE(proxy->up());
  const int steps = 300;  // two micro-batches of 8 a step: the fault may come between them
  const std::vector<std::string> shape = {"train.micro_batch_size=8", "train.grad_accum=2"};
  auto local = test::run_bin("trainer", {config("local", data, "", steps), shape[0], shape[1]});
  ASSERT_EQ(local.exit_code, 0) << local.out;
  auto cut = test::run_bin("trainer", {config("run", url(proxy->port), "remote_timeout_s: 2", steps), shape[0], shape[1]});
  ASSERT_EQ(cut.exit_code, 1) << cut.out;
  EXPECT_EQ(test::count_in(cut.out, "trainer: error:"), 1) << cut.out;
  EXPECT_NE(cut.out.find("trainer: error: " + url(proxy->port) + "/train_"), std::string::npos) << cut.out;
  EXPECT_NE(cut.out.find("longer than data.remote_timeout_s"), std::string::npos) << cut.out;
  const Hashes before = batch_hashes("run");
  ASSERT_FALSE(before.empty());
  ASSERT_LT(before.rbegin()->first, steps);
  EXPECT_TRUE(test::fs::exists(run_dir::checkpoint(tmp_ / "runs/run", before.rbegin()->first))) << cut.out;
  auto rerun = test::run_bin("trainer", {config("run", url(nginx->port), "remote_timeout_s: 30", steps), shape[0], shape[1]});
  ASSERT_EQ(rerun.exit_code, 0) << rerun.out;
  EXPECT_NE(rerun.out.find("resumed from"), std::string::npos) << rerun.out;
  EXPECT_EQ(batch_hashes("run"), batch_hashes("local"));
}

// A permanent answer mid-run (403: an expired session token) ends the run at once, exit 2, after
// the last whole step's checkpoint and the weights, meta.json saying why; rerun against the good
// server, it resumes there with the local run's batches.
TEST_F(RemoteTrainTest, ForbiddenMidRunKeepsTheLastStep) {
  const std::string data = test::make_dataset(tmp_.path(), 3000, 2000);
  auto nginx = test::start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  auto proxy = test::start_proxy(nginx->port, tmp_.path(), {"--fail", "0", "--forbid-after", "20"});
  ASSERT_TRUE(proxy->up());
  const int steps = 300;
  const std::vector<std::string> shape = {"train.micro_batch_size=8", "train.grad_accum=2"};
  auto local = test::run_bin("trainer", {config("local", data, "", steps), shape[0], shape[1]});
  ASSERT_EQ(local.exit_code, 0) << local.out;
  auto cut = test::run_bin("trainer", {config("run", url(proxy->port), "", steps), shape[0], shape[1]});
  ASSERT_EQ(cut.exit_code, 2) << cut.out;
  EXPECT_EQ(test::count_in(cut.out, "trainer: error:"), 1) << cut.out;
  EXPECT_NE(cut.out.find("403"), std::string::npos) << cut.out;
  const Hashes before = batch_hashes("run");
  ASSERT_FALSE(before.empty());
  const int64_t last = before.rbegin()->first;
  ASSERT_LT(last, steps);
  EXPECT_NE(cut.out.find("stopped after step " + std::to_string(last) + ":"), std::string::npos) << cut.out;
  EXPECT_TRUE(test::fs::exists(run_dir::checkpoint(tmp_ / "runs/run", last))) << cut.out;
  EXPECT_TRUE(test::fs::exists(run_dir::weights(tmp_ / "runs/run"))) << cut.out;
  const auto meta = nlohmann::json::parse(test::read_text(run_dir::meta(tmp_ / "runs/run")));
  EXPECT_EQ(meta.at("exit_code"), 2);
  EXPECT_NE(meta.at("error").get<std::string>().find("403"), std::string::npos) << meta.dump();
  auto rerun = test::run_bin("trainer", {config("run", url(nginx->port), "", steps), shape[0], shape[1]});
  ASSERT_EQ(rerun.exit_code, 0) << rerun.out;
  EXPECT_NE(rerun.out.find("resumed from"), std::string::npos) << rerun.out;
  EXPECT_EQ(batch_hashes("run"), batch_hashes("local"));
}

// A cache limit below what the prefetch depth needs fails at start: exit 2, one line naming the
// key and the minimum, nothing fetched but the manifest.
TEST_F(RemoteTrainTest, CacheTooSmallFailsAtStartNamingTheMinimum) {
  test::make_dataset(tmp_.path(), 40000, 150000);  // shards of ~0.3 MB
  auto nginx = test::start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  auto r = test::run_bin("trainer", {config("small", url(nginx->port), "cache_limit_mb: 1, remote_ahead: 4", 10)});
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(test::count_in(r.out, "error"), 1) << r.out;
  EXPECT_NE(r.out.find("trainer: error: key 'data.cache_limit_mb': 1 is too small:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("data.remote_ahead adds 4"), std::string::npos) << r.out;
  const size_t at = r.out.find("at least ", r.out.find("fetched):"));
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_GT(std::atof(r.out.c_str() + at + 9), 1.0) << r.out;  // the minimum, in MiB, above the limit
  EXPECT_EQ(test::count_in(test::read_text(tmp_ / "nginx/access.log"), "/data/train_"), 0);
}

// Two runs at once on one cache that holds about 10 of the 48 shards: both complete, each with the
// batches of its local twin, and the cache stays under its limit.
TEST_F(RemoteTrainTest, TwoRunsShareOneCache) {
  const std::string data = test::make_dataset(tmp_.path(), 20000, 25000);
  auto nginx = test::start_nginx(tmp_.path(), tmp_.path());
  ASSERT_TRUE(nginx->up());
  const int steps = 200;  // ~8 shards each, in different orders (seeds)
  const std::vector<std::string> shape = {"train.micro_batch_size=16", "model.seq_len=64", "data.shuffle_buffer=16"};
  std::vector<test::Proc> runs;
  for (int seed : {1, 2}) {
    std::vector<std::string> args = {config("remote" + std::to_string(seed), url(nginx->port), "cache_limit_mb: 0.5", steps, seed)};
    args.insert(args.end(), shape.begin(), shape.end());
    runs.push_back(test::spawn_bin("trainer", args, tmp_ / ("remote" + std::to_string(seed) + ".log")));
  }
  for (int seed : {1, 2}) {
    std::vector<std::string> args = {config("local" + std::to_string(seed), data, "", steps, seed)};
    args.insert(args.end(), shape.begin(), shape.end());
    auto r = test::run_bin("trainer", args);
    ASSERT_EQ(r.exit_code, 0) << r.out;
  }
  for (int i = 0; i < 2; ++i) ASSERT_EQ(test::wait_proc(runs[i], 300), 0) << test::read_text(runs[i].log);
  for (int seed : {1, 2})
    EXPECT_EQ(batch_hashes("remote" + std::to_string(seed)), batch_hashes("local" + std::to_string(seed)));
  uint64_t cached = 0;
  for (const auto& e : test::fs::directory_iterator(tmp_ / "cache"))
    if (e.path().filename() != ".lock") cached += test::fs::file_size(e.path());
  EXPECT_LE(cached, uint64_t{1} << 19);
  const int evicted = test::count_in(test::read_text(runs[0].log) + test::read_text(runs[1].log), "data cache: evicted");
  EXPECT_GT(evicted, 0) << "the runs did not contend for the cache";
}

}  // namespace
}  // namespace lm
