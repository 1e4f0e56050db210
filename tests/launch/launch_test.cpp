// Tests of build/bin/launch in real processes: the worker environment, output prefixing and
// per-rank logs, group restarts, exit codes and the failure summary, signal forwarding with the
// grace period, --standalone, two "nodes" over loopback, bad input, and a cross-check of the
// environment against the real torchrun (Debian's python3-torch) when it is installed.
// Workers are build/bin/launch_fake_worker (tests/fake_worker.cpp) or small shell scripts.

#include "tests/launch/launch_util.h"

namespace {

using namespace lm::launch_test;  // NOLINT: the shared helpers

// ---- the environment contract ---------------------------------------------------------------

TEST(Launch, EnvContractPerRank) {
  TempDir tmp;
  auto r = launch({"--nproc-per-node", "3", "--standalone", "--run-id", "envrun", "--log-dir", tmp / "logs",
                   "--role", "trainer", "--max-restarts", "2", "--", kWorker, "--print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto envs = envs_by_rank(r.out);
  ASSERT_EQ(envs.size(), 3u) << r.out;
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    auto& e = envs[rank];
    EXPECT_EQ(e["RANK"], std::to_string(rank));
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], "3");
    EXPECT_EQ(e["ROLE_NAME"], "trainer");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "2");
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "envrun");
    EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "False");  // the workers' rank 0 hosts their store
    EXPECT_EQ(e["OMP_NUM_THREADS"], "1");  // unset in launch's environment, 3 workers
    EXPECT_FALSE(e["MASTER_PORT"].empty());
    if (rank == 0) port = e["MASTER_PORT"];
    EXPECT_EQ(e["MASTER_PORT"], port);
  }
}

TEST(Launch, UnderscoreSpellingsWithoutDoubleDash) {
  TempDir tmp;
  int port = free_port();
  auto r = launch({"--nproc_per_node", "2", "--nnodes", "1", "--node_rank", "0", "--master_addr", "127.0.0.1",
                   "--master_port", std::to_string(port), "--max_restarts", "1", "--log_dir", tmp / "logs",
                   "--run_id", "under", "--grace_period", "1", "--monitor_interval", "0.1", "--no_python", kWorker,
                   "--print-env"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto envs = envs_by_rank(r.out);
  ASSERT_EQ(envs.size(), 2u) << r.out;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(envs[rank]["RANK"], std::to_string(rank));
    EXPECT_EQ(envs[rank]["MASTER_PORT"], std::to_string(port));
    EXPECT_EQ(envs[rank]["TORCHELASTIC_MAX_RESTARTS"], "1");
    EXPECT_EQ(envs[rank]["TORCHELASTIC_RUN_ID"], "under");
  }
  EXPECT_TRUE(fs::exists(tmp / "logs/under/attempt_0/rank_1.log"));
  // Arguments after COMMAND belong to it, even when they look like launch options.
  auto r2 = launch({"--standalone", "--log-dir", tmp / "logs", kWorker, "--print-env", "--nproc-per-node", "2"});
  EXPECT_EQ(r2.exit_code, 64) << r2.out;  // the fake worker rejects the unknown argument
}

TEST(Launch, OmpNumThreadsRule) {
  TempDir tmp;
  auto one = launch({"--standalone", "--log-dir", tmp / "logs", "--", kWorker, "--print-env"});
  ASSERT_EQ(one.exit_code, 0) << one.out;
  EXPECT_EQ(envs_by_rank(one.out)[0].count("OMP_NUM_THREADS"), 0u) << "one worker: left unset";
  auto kept = launch({"--standalone", "--nproc-per-node", "2", "--log-dir", tmp / "logs", "--", kWorker, "--print-env"},
                     {"OMP_NUM_THREADS=7"});
  ASSERT_EQ(kept.exit_code, 0) << kept.out;
  auto envs = envs_by_rank(kept.out);
  EXPECT_EQ(envs[0]["OMP_NUM_THREADS"], "7");
  EXPECT_EQ(envs[1]["OMP_NUM_THREADS"], "7");
}

// ---- output ---------------------------------------------------------------------------------------

TEST(Launch, OutputPrefixedAndLoggedPerRank) {
  TempDir tmp;
  Child c = start({"--standalone", "--nproc-per-node", "2", "--run-id", "out", "--log-dir", tmp / "logs", "--",
                   kWorker, "--lines", "3"},
                  tmp / "stdout", tmp / "stderr");
  ASSERT_EQ(finish(c), 0) << read_text(tmp / "stderr");
  std::string out = read_text(tmp / "stdout"), err = read_text(tmp / "stderr");
  for (int r = 0; r < 2; ++r) {
    std::string p = "[rank" + std::to_string(r) + "]: ";
    EXPECT_NE(out.find(p + "worker rank=" + std::to_string(r)), std::string::npos) << out;
    EXPECT_NE(out.find(p + "line 3\n"), std::string::npos) << out;
    EXPECT_EQ(out.find(p + "stderr of rank"), std::string::npos) << "stderr lines stay on stderr";
    EXPECT_NE(err.find(p + "stderr of rank " + std::to_string(r)), std::string::npos) << err;
    std::string log = read_text(tmp / ("logs/out/attempt_0/rank_" + std::to_string(r) + ".log"));
    EXPECT_NE(log.find("worker rank=" + std::to_string(r)), std::string::npos) << log;
    EXPECT_NE(log.find("stderr of rank " + std::to_string(r)), std::string::npos) << log;
    // stdout lines in order (the stderr line may fall between them: two pipes)
    EXPECT_LT(log.find("line 1\n"), log.find("line 2\n")) << log;
    EXPECT_LT(log.find("line 2\n"), log.find("line 3\n")) << log;
    EXPECT_NE(log.find("line 3\n"), std::string::npos) << log;
    EXPECT_EQ(log.find("[rank"), std::string::npos) << "logs are unprefixed";
  }
  for (auto& l : lines_of(out)) EXPECT_EQ(l.rfind("[rank", 0), 0u) << "unprefixed stdout line: " << l;
}

// ---- failures and restarts ------------------------------------------------------------------------

TEST(Launch, FailedWorkerRestartsGroupThenSucceeds) {
  TempDir tmp;
  auto t0 = Clock::now();
  // Attempt 0: rank 1 exits 3 once rank 0 is up, while rank 0 sleeps 30 s (stopped with SIGTERM);
  // attempt 1 succeeds.
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "2", "--run-id", "rs", "--log-dir",
                   tmp / "logs", "--grace-period", "5", "--", kWorker, "--print-env", "--fail-rank", "1",
                   "--fail-attempt", "0", "--exit-code", "3", "--sleep", "30", "--sleep-attempt", "0", "--up-dir",
                   tmp / "up", "--wait-up", "2"});
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_LT(secs, 20) << "the sleeping rank was not stopped";
  EXPECT_NE(r.out.find("[rank0]: rank 0 got SIGTERM"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attempt 0 failed: rank 1 (node 0) exited with code 3"), std::string::npos) << r.out;
  EXPECT_NE(read_text(tmp / "logs/rs/attempt_0/rank_0.log").find("rank 0 got SIGTERM"), std::string::npos);
  EXPECT_EQ(count(r.out, "ENV TORCHELASTIC_RESTART_COUNT=0"), 2u) << r.out;
  EXPECT_EQ(count(r.out, "ENV TORCHELASTIC_RESTART_COUNT=1"), 2u) << r.out;
  EXPECT_EQ(count(r.out, "ENV TORCHELASTIC_RESTART_COUNT=2"), 0u) << r.out;
  EXPECT_TRUE(fs::exists(tmp / "logs/rs/attempt_1/rank_0.log"));
  EXPECT_TRUE(fs::exists(tmp / "logs/rs/attempt_1/rank_1.log"));
}

TEST(Launch, PastMaxRestartsExitCodeAndSummary) {
  TempDir tmp;
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--run-id", "pm", "--log-dir",
                   tmp / "logs", "--", kWorker, "--lines", "15", "--fail-rank", "1", "--exit-code", "7"});
  EXPECT_EQ(r.exit_code, 7) << r.out;
  EXPECT_EQ(count(r.out, "[rank1]: worker rank=1 local_rank=1 attempt="), 2u) << "one restart: " << r.out;
  EXPECT_NE(r.out.find("worker group failed on attempt 1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 1 (node 0, local rank 1, pid "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("exited with code 7"), std::string::npos) << r.out;
  auto summary = r.out.substr(r.out.find("worker group failed"));
  EXPECT_NE(summary.find("pm/attempt_1/rank_1.log"), std::string::npos) << summary;
  // The tail: 10 lines; the worker's one stderr line may land anywhere among its stdout lines.
  EXPECT_EQ(count(summary, "launch:     | "), 10u) << summary;
  for (int i = 7; i <= 15; ++i) EXPECT_NE(summary.find("| line " + std::to_string(i) + "\n"), std::string::npos) << summary;
  EXPECT_EQ(summary.find("| line 5\n"), std::string::npos) << summary;
}

TEST(Launch, KilledWorkerReportedBySignalName) {
  TempDir tmp;
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--log-dir", tmp / "logs", "--", kWorker, "--fail-rank", "0",
                   "--signal", std::to_string(SIGKILL), "--sleep", "30"});
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.out;
  EXPECT_NE(r.out.find("rank 0 (node 0, local rank 0, pid "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("was killed by SIGKILL"), std::string::npos) << r.out;
  auto segv = launch({"--standalone", "--log-dir", tmp / "logs", "--", kWorker, "--fail-rank", "0", "--signal",
                      std::to_string(SIGSEGV)});
  EXPECT_EQ(segv.exit_code, 128 + SIGSEGV) << segv.out;
  EXPECT_NE(segv.out.find("was killed by SIGSEGV"), std::string::npos) << segv.out;
}

// ---- signals --------------------------------------------------------------------------------------

TEST(Launch, SigtermForwardedThenSigkillAfterGrace) {
  TempDir tmp;
  // Rank 0 ignores SIGTERM (needs the SIGKILL), rank 1 exits on it.
  Child c = start({"--standalone", "--nproc-per-node", "2", "--run-id", "sig", "--log-dir", tmp / "logs",
                   "--grace-period", "1", "--", kWorker, "--sleep", "60", "--ignore-term", "--ignore-rank", "0"},
                  tmp / "stdout", tmp / "stderr");
  ASSERT_TRUE(wait_until_count(tmp / "stdout", "worker rank=", 2)) << read_text(tmp / "stderr");
  auto pids = worker_pids(read_text(tmp / "stdout"));
  ASSERT_EQ(pids.size(), 2u);
  auto t0 = Clock::now();
  c.proc.signal(SIGTERM);
  int code = finish(c, 30);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(code, 128 + SIGTERM) << read_text(tmp / "stderr");
  EXPECT_GE(secs, 0.9) << "rank 0 ignores SIGTERM: launch waits the grace period";
  EXPECT_LT(secs, 10);
  std::string out = read_text(tmp / "stdout");
  EXPECT_NE(out.find("[rank1]: rank 1 got SIGTERM"), std::string::npos) << out;
  EXPECT_EQ(out.find("rank 0 got"), std::string::npos) << out;
  for (auto& [rank, pid] : pids) EXPECT_FALSE(process_exists(pid)) << "rank " << rank << " survived";
  EXPECT_NE(read_text(tmp / "stderr").find("SIGTERM received"), std::string::npos);
}

TEST(Launch, SigintForwarded) {
  TempDir tmp;
  Child c = start({"--standalone", "--nproc-per-node", "2", "--log-dir", tmp / "logs", "--grace-period", "20", "--",
                   kWorker, "--sleep", "60"},
                  tmp / "stdout", tmp / "stderr");
  ASSERT_TRUE(wait_until_count(tmp / "stdout", "worker rank=", 2)) << read_text(tmp / "stderr");
  auto t0 = Clock::now();
  c.proc.signal(SIGINT);
  EXPECT_EQ(finish(c, 30), 128 + SIGINT);
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10) << "workers exit on SIGINT: no grace wait";
  std::string out = read_text(tmp / "stdout");
  EXPECT_NE(out.find("[rank0]: rank 0 got SIGINT"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank1]: rank 1 got SIGINT"), std::string::npos) << out;
}

// ---- rendezvous -----------------------------------------------------------------------------------
TEST(Launch, StandalonePicksAFreePortPerAttemptAndHostsNothing) {
  TempDir tmp;
  auto r = launch({"--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", tmp / "logs", "--",
                   kWorker, "--print-env", "--connect", "--fail-rank", "1", "--fail-attempt", "0", "--up-dir",
                   tmp / "up", "--wait-up", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.out;
  auto envs = envs_by_rank(r.out);
  EXPECT_EQ(envs[0]["TORCHELASTIC_RUN_ID"].size(), 16u) << "a random run id";
  auto ports = master_ports(r.out);
  ASSERT_EQ(ports.size(), 2u) << r.out;
  EXPECT_GT(ports[0], 0);
  EXPECT_NE(ports[0], 29500);
  EXPECT_NE(ports[0], ports[1]) << "a new port for the restart";
  EXPECT_EQ(envs[0]["MASTER_PORT"], std::to_string(ports[1]));
  // The launcher listens on no port of the workers': their rank 0 hosts the store there.
  EXPECT_EQ(count(r.out, "connect failed"), 4u) << r.out;
  // Two standalone launches at once do not collide.
  Child a = start({"--standalone", "--log-dir", tmp / "logs", "--", kWorker, "--sleep", "0.5", "--print-env"},
                  tmp / "a.out", tmp / "a.err");
  Child b = start({"--standalone", "--log-dir", tmp / "logs", "--", kWorker, "--sleep", "0.5", "--print-env"},
                  tmp / "b.out", tmp / "b.err");
  EXPECT_EQ(finish(a), 0) << read_text(tmp / "a.err");
  EXPECT_EQ(finish(b), 0) << read_text(tmp / "b.err");
  EXPECT_NE(envs_by_rank(read_text(tmp / "a.out"))[0]["MASTER_PORT"],
            envs_by_rank(read_text(tmp / "b.out"))[0]["MASTER_PORT"]);
}

TEST(Launch, BadInputOneLineExit2) {
  TempDir tmp;
  const std::string ld = tmp / "logs";
  const std::vector<std::vector<std::string>> cases = {
      {},                                                      // no command
      {"--log-dir", ld, "--"},                                 // no command after --
      {"--nproc-per-node", "0", kWorker},                      // nproc 0
      {"--nproc_per_node", "two", kWorker},                    // not a number
      {"--nnodes", "2", "--node-rank", "2", kWorker},          // node rank out of range
      {"--node-rank", "-1", kWorker},                          // negative node rank
      {"--bogus", kWorker},                                    // unknown option
      {"--max-restarts", "-1", kWorker},                       // negative restarts
      {"--master-port", "70000", kWorker},                     // port out of range
      {"--standalone", "--nnodes", "2", kWorker},              // standalone is one node
      {"--nnodes", "1:4", kWorker},                            // elastic range
      {"--grace-period", "soon", kWorker},                     // CLI11 conversion error
      {"--nproc-per-node"},                                    // CLI11: value missing
      {"--log-dir", ld, "no_such_command_xyz"},                // command not found
      {"--log-dir", "/proc/launch_test", kWorker},             // log dir not creatable
      {"--rdzv-endpoint", "node0", kWorker},                   // no port
      {"--rdzv-endpoint", "node0:70000", kWorker},             // port out of range
      {"--standalone", "--rdzv-endpoint", "node0:1", kWorker}, // standalone serves nothing
  };
  std::vector<std::future<RunResult>> runs;  // in parallel
  for (auto& args : cases) runs.push_back(std::async(std::launch::async, [&args] { return launch(args); }));
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto& args = cases[i];
    auto r = runs[i].get();
    std::string shown;
    for (auto& a : args) shown += a + " ";
    EXPECT_EQ(r.exit_code, 2) << shown << "\n" << r.out;
    auto lines = lines_of(r.out);
    EXPECT_EQ(lines.size(), 1u) << shown << "\n" << r.out;
    EXPECT_EQ(r.out.rfind("launch: error: ", 0), 0u) << shown << "\n" << r.out;
  }
}

TEST(Launch, PortInUseOnNode0) {
  TempDir tmp;
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 1), 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  int port = ntohs(a.sin_port);
  auto r = launch({"--master-port", std::to_string(port), "--log-dir", tmp / "logs", "--", kWorker});
  ::close(s);
  EXPECT_EQ(r.exit_code, 2) << r.out;
  EXPECT_EQ(lines_of(r.out).size(), 1u) << r.out;
  EXPECT_NE(r.out.find("--master-port " + std::to_string(port) + " is already in use"), std::string::npos) << r.out;
}

TEST(Launch, HelpExitsZero) {
  auto r = launch({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  for (const char* opt : {"--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank",
                          "--master-addr", "--master-port", "--max-restarts", "--log-dir", "--standalone", "--run-id",
                          "--grace-period", "--monitor-interval", "--rdzv-endpoint"})
    EXPECT_NE(r.out.find(opt), std::string::npos) << opt;
}

// ---- the real torchrun ------------------------------------------------------------------------------

// Names of the variables a worker sees that were not in the (empty) environment launch got.
std::set<std::string> added_names(const std::string& env_file) {
  std::set<std::string> names;
  for (auto& l : lines_of(read_text(env_file))) names.insert(l.substr(0, l.find('=')));
  for (const char* parent : {"PATH", "PWD", "SHLVL", "_"}) names.erase(parent);
  return names;
}

TEST(Launch, SameVariablesAsTorchrun) {
  if (lm::test::run_bin("/usr/bin/python3", {"-c", "import torch.distributed.run"}).exit_code != 0)
    GTEST_SKIP() << "no torch for /usr/bin/python3";
  TempDir tmp;
  write_text(tmp / "env.sh", "#!/bin/sh\nenv > \"" + tmp.path() + "/$WHO.$RANK.env\"\n");
  fs::permissions(tmp / "env.sh", fs::perms::owner_all);
  // torchrun's c10d rendezvous, which launch follows: the agents meet at --rdzv_endpoint and the
  // workers' rank 0 hosts their store (TORCHELASTIC_USE_AGENT_STORE=False). --redirects/--tee:
  // torchrun 1.13's default "0" trips over Python 3.11's enum.IntFlag.
  auto tr = lm::test::run_bin("/usr/bin/env", {"-i", "PATH=/usr/bin:/bin", "WHO=torchrun", "/usr/bin/python3", "-m",
                                               "torch.distributed.run", "--nproc_per_node", "2", "--rdzv_backend",
                                               "c10d", "--rdzv_endpoint", "127.0.0.1:" + std::to_string(free_port()),
                                               "--rdzv_id", "none", "--monitor_interval", "0.2", "--redirects", "1:1",
                                               "--tee", "1:1", "--no_python", tmp / "env.sh"});
  if (tr.exit_code != 0 && !lm::test::python_torch_lacks_libuv(tr.out).empty())
    GTEST_SKIP() << lm::test::python_torch_lacks_libuv(tr.out);
  ASSERT_EQ(tr.exit_code, 0) << tr.out;
  auto ours = lm::test::run_bin("/usr/bin/env", {"-i", "PATH=/usr/bin:/bin", "WHO=launch", bin_path("launch"),
                                                 "--nproc_per_node", "2", "--master_port",
                                                 std::to_string(free_port()), "--log_dir", tmp / "logs",
                                                 "--no_python", tmp / "env.sh"});
  ASSERT_EQ(ours.exit_code, 0) << ours.out;
  for (int rank = 0; rank < 2; ++rank) {
    auto theirs = added_names(tmp / ("torchrun." + std::to_string(rank) + ".env"));
    theirs.erase("TORCHELASTIC_ERROR_FILE");  // torchrun's Python error-file protocol (@record)
    theirs.erase("LC_CTYPE");                 // Python's C-locale coercion, not torchrun
    // launch sets torchrun 2.2+'s name whatever the workers' LibTorch (the trainer maps it for 1.13);
    // torchrun 1.13 sets the old one.
    if (theirs.erase("NCCL_ASYNC_ERROR_HANDLING")) theirs.insert("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    auto mine = added_names(tmp / ("launch." + std::to_string(rank) + ".env"));
    EXPECT_EQ(mine, theirs) << "rank " << rank;
    EXPECT_TRUE(mine.count("TORCHELASTIC_USE_AGENT_STORE")) << "rank " << rank;
    // Values that do not depend on ports, host names or temp dirs agree too (torchrun's c10d
    // rendezvous gives the workers node 0's host name as MASTER_ADDR; launch --master-addr's value).
    auto values = [](const std::string& file) {
      std::map<std::string, std::string> m;
      for (auto& l : lines_of(read_text(file))) m[l.substr(0, l.find('='))] = l.substr(l.find('=') + 1);
      return m;
    };
    auto tv = values(tmp / ("torchrun." + std::to_string(rank) + ".env"));
    auto mv = values(tmp / ("launch." + std::to_string(rank) + ".env"));
    for (const char* k : {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
                          "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "TORCHELASTIC_RESTART_COUNT",
                          "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
                          "OMP_NUM_THREADS"})
      EXPECT_EQ(mv[k], tv[k]) << k << " rank " << rank;
    EXPECT_EQ(mv["TORCHELASTIC_USE_AGENT_STORE"], "False") << "rank " << rank;
    EXPECT_EQ(mv["MASTER_ADDR"], "127.0.0.1") << "rank " << rank;
    EXPECT_EQ(mv["TORCH_NCCL_ASYNC_ERROR_HANDLING"], "1") << "rank " << rank;
  }
}

}  // namespace
