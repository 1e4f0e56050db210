// Tests of build/bin/launch as two "nodes" of one job over loopback: ranks across nodes, nodes that
// disagree or are lost, group restarts and signals on either node, and real torch.distributed workers
// across the two (see launch_util.h).

#include "tests/launch/launch_util.h"

namespace {

using namespace lm::launch_test;  // NOLINT: the shared helpers

// Two launch processes as node 0 and node 1 of one job over loopback.
struct TwoNodes {
  int rdzv_port = 0;
  Child node[2];
  int code[2] = {-1, -1};
  std::string out[2];
};

TwoNodes run_two_nodes(const TempDir& tmp, const std::string& run_id, const std::vector<std::string>& extra,
                       const std::vector<std::string>& worker) {
  int port = free_port();
  TwoNodes t;
  t.rdzv_port = port;
  for (int k : {1, 0}) {  // node 1 first: it waits for node 0's launch
    std::vector<std::string> args = {"--nnodes", "2", "--node-rank", std::to_string(k), "--master-addr", "127.0.0.1",
                                     "--master-port", std::to_string(port), "--run-id", run_id, "--log-dir",
                                     tmp / "logs", "--monitor-interval", "0.1", "--grace-period", "2"};
    args.insert(args.end(), extra.begin(), extra.end());
    args.push_back("--");
    args.insert(args.end(), worker.begin(), worker.end());
    t.node[k] = start(args, tmp / (run_id + "_node" + std::to_string(k) + ".out"),
                      tmp / (run_id + "_node" + std::to_string(k) + ".out"));
    if (k == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  for (int k = 0; k < 2; ++k) {
    t.code[k] = finish(t.node[k], 60);
    t.out[k] = read_text(t.node[k].out);
  }
  return t;
}

TEST(Launch, TwoNodesLoopbackRanks) {
  TempDir tmp;
  auto t = run_two_nodes(tmp, "two", {"--nproc-per-node", "2"}, {kWorker, "--print-env"});
  ASSERT_EQ(t.code[0], 0) << t.out[0];
  ASSERT_EQ(t.code[1], 0) << t.out[1];
  std::set<int> ranks;
  for (int k = 0; k < 2; ++k) {
    auto envs = envs_by_rank(t.out[k]);
    ASSERT_EQ(envs.size(), 2u) << t.out[k];
    for (auto& [rank, e] : envs) {
      ranks.insert(rank);
      EXPECT_EQ(e["RANK"], std::to_string(rank));
      EXPECT_EQ(rank / 2, k) << "node k holds ranks 2k, 2k+1";
      EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank % 2));
      EXPECT_EQ(e["WORLD_SIZE"], "4");
      EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
      EXPECT_EQ(e["GROUP_RANK"], std::to_string(k));
      EXPECT_EQ(e["GROUP_WORLD_SIZE"], "2");
      EXPECT_EQ(e["ROLE_RANK"], std::to_string(rank));
      EXPECT_EQ(e["ROLE_WORLD_SIZE"], "4");
      EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "two");
    }
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(fs::exists(tmp / ("logs/two/attempt_0/rank_" + std::to_string(r) + ".log"))) << r;
}

TEST(Launch, TwoNodesUnevenNprocRanksWithoutGaps) {
  TempDir tmp;
  int port = free_port();
  auto common = [&](int k, int nproc) {
    return std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(k), "--nproc-per-node",
                                    std::to_string(nproc), "--rdzv-endpoint", "localhost:" + std::to_string(port),
                                    "--log-dir", tmp / "logs", "--monitor-interval", "0.1", "--", kWorker,
                                    "--print-env"};
  };
  Child n1 = start(common(1, 2), tmp / "n1", tmp / "n1");
  Child n0 = start(common(0, 1), tmp / "n0", tmp / "n0");
  ASSERT_EQ(finish(n0), 0) << read_text(tmp / "n0");
  ASSERT_EQ(finish(n1), 0) << read_text(tmp / "n1");
  auto e0 = envs_by_rank(read_text(tmp / "n0")), e1 = envs_by_rank(read_text(tmp / "n1"));
  ASSERT_EQ(e0.size(), 1u);
  ASSERT_EQ(e1.size(), 2u);
  EXPECT_EQ(e0[0]["WORLD_SIZE"], "3");
  EXPECT_EQ(e1[1]["LOCAL_RANK"], "0");
  EXPECT_EQ(e1[2]["LOCAL_RANK"], "1");
  EXPECT_EQ(e1[2]["WORLD_SIZE"], "3");
  // --rdzv-endpoint without --master-addr: its host is node 0's, for the workers too.
  EXPECT_EQ(e1[2]["MASTER_ADDR"], "localhost");
  EXPECT_EQ(e0[0]["MASTER_PORT"], e1[1]["MASTER_PORT"]);
  EXPECT_NE(e0[0]["MASTER_PORT"], std::to_string(port));
}

// Checked to fail with HELLO not comparing --max-restarts.
TEST(Launch, TwoNodesThatDisagreeAreRefused) {
  TempDir tmp;
  int port = free_port();
  auto args = [&](int k, const std::string& restarts) {
    return std::vector<std::string>{"--nnodes", "2", "--node-rank", std::to_string(k), "--master-port",
                                    std::to_string(port), "--max-restarts", restarts, "--rdzv-timeout", "5",
                                    "--log-dir", tmp / "logs", "--", kWorker};
  };
  Child n0 = start(args(0, "1"), tmp / "n0", tmp / "n0");
  auto r1 = launch(args(1, "3"));
  EXPECT_EQ(r1.exit_code, 2) << r1.out;
  EXPECT_EQ(lines_of(r1.out).size(), 2u) << "the connecting line and one error line: " << r1.out;
  EXPECT_NE(r1.out.find("launch: error: node 0 runs with --run-id none --nnodes 2 --max-restarts 1, this node with "
                        "none, 2 and 3: every node needs the same values"),
            std::string::npos)
      << r1.out;
  EXPECT_EQ(finish(n0, 30), 1) << read_text(tmp / "n0");
  EXPECT_NE(read_text(tmp / "n0").find("waiting for node(s) 1"), std::string::npos) << read_text(tmp / "n0");
}

// Node 1's launcher dies (SIGKILL) mid-run: its workers die with it (PR_SET_PDEATHSIG), node 0
// fails the attempt, stops its workers, and its restart times out waiting for node 1. Checked to
// fail with Coordinator::lost recording no failure.
TEST(Launch, TwoNodesLostLauncherFailsTheAttempt) {
  TempDir tmp;
  int port = free_port();
  Child node[2];
  for (int k : {0, 1})
    node[k] = start({"--nnodes", "2", "--node-rank", std::to_string(k), "--master-port", std::to_string(port),
                     "--max-restarts", "1", "--rdzv-timeout", "6", "--log-dir", tmp / "logs", "--monitor-interval",
                     "0.1", "--grace-period", "2", "--", kWorker, "--sleep", "60"},
                    tmp / ("node" + std::to_string(k)), tmp / ("node" + std::to_string(k)));
  for (int k : {0, 1})
    ASSERT_TRUE(wait_until_count(tmp / ("node" + std::to_string(k)), "worker rank=", 1)) << read_text(tmp / "node0");
  auto pids = worker_pids(read_text(tmp / "node1"));
  node[1].proc.signal(SIGKILL);
  finish(node[1], 10);
  EXPECT_EQ(finish(node[0], 30), 1) << read_text(tmp / "node0");
  const std::string out = read_text(tmp / "node0");
  EXPECT_NE(out.find("attempt 0 failed: node 1 lost its launch (connection closed)"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank0]: rank 0 got SIGTERM"), std::string::npos) << out;
  EXPECT_NE(out.find("attempt 1: timed out after 6 s waiting for node(s) 1"), std::string::npos) << out;
  auto t0 = Clock::now();
  for (auto& [rank, pid] : pids)
    while (process_exists(pid) && std::chrono::duration<double>(Clock::now() - t0).count() < 10)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (auto& [rank, pid] : pids) EXPECT_FALSE(process_exists(pid)) << "rank " << rank << " outlived its launcher";
}

TEST(Launch, TwoNodesFailureOnOneRestartsBoth) {
  TempDir tmp;
  // Attempt 0: rank 3 (node 1) exits 5 once all 4 are up; the others sleep 30 s and must be
  // stopped on both nodes.
  auto t = run_two_nodes(tmp, "fail", {"--nproc-per-node", "2", "--max-restarts", "1"},
                         {kWorker, "--print-env", "--fail-rank", "3", "--fail-attempt", "0", "--exit-code", "5",
                          "--sleep", "30", "--sleep-attempt", "0", "--up-dir", tmp / "up", "--wait-up", "4"});
  ASSERT_EQ(t.code[0], 0) << t.out[0];
  ASSERT_EQ(t.code[1], 0) << t.out[1];
  for (int k = 0; k < 2; ++k) {
    EXPECT_NE(t.out[k].find("attempt 0 failed: rank 3 (node 1) exited with code 5"), std::string::npos) << t.out[k];
    EXPECT_EQ(count(t.out[k], "ENV TORCHELASTIC_RESTART_COUNT=1"), 2u) << t.out[k];
  }
  EXPECT_NE(t.out[0].find("[rank0]: rank 0 got SIGTERM"), std::string::npos) << t.out[0];
  EXPECT_NE(t.out[0].find("[rank1]: rank 1 got SIGTERM"), std::string::npos) << t.out[0];
  EXPECT_NE(t.out[1].find("[rank2]: rank 2 got SIGTERM"), std::string::npos) << t.out[1];
  // Node 0 picks the workers' MASTER_PORT of each attempt and every node uses it; a new one for
  // the restart, and never the launchers' own port.
  auto p0 = master_ports(t.out[0]), p1 = master_ports(t.out[1]);
  ASSERT_EQ(p0.size(), 2u) << t.out[0];
  EXPECT_EQ(p0, p1);
  EXPECT_NE(p0[0], p0[1]);
  for (auto& [attempt, port] : p0) EXPECT_NE(port, t.rdzv_port) << attempt;
}

TEST(Launch, TwoNodesPastMaxRestartsBothExitWithWorkerCode) {
  TempDir tmp;
  auto t = run_two_nodes(tmp, "dead", {"--nproc-per-node", "1", "--max-restarts", "1"},
                         {kWorker, "--fail-rank", "1", "--exit-code", "9", "--sleep", "30"});
  EXPECT_EQ(t.code[0], 9) << t.out[0];
  EXPECT_EQ(t.code[1], 9) << t.out[1];
  for (int k = 0; k < 2; ++k)
    EXPECT_NE(t.out[k].find("rank 1 (node 1, local rank 0, pid "), std::string::npos) << t.out[k];
  EXPECT_NE(t.out[1].find("last 2 line(s) of"), std::string::npos) << "the failing node shows the log tail";
}

TEST(Launch, TwoNodesFinishedNodeRestartsWhenOtherFails) {
  TempDir tmp;
  // Attempt 0: node 0's worker exits 0 at once; node 1's fails 1 s later. The group restarts on
  // both nodes: a finished node waits for the others and joins the restart.
  auto t = run_two_nodes(tmp, "late", {"--nproc-per-node", "1", "--max-restarts", "1"},
                         {kWorker, "--print-env", "--fail-rank", "1", "--fail-attempt", "0", "--fail-after", "1",
                          "--exit-code", "4"});
  ASSERT_EQ(t.code[0], 0) << t.out[0];
  ASSERT_EQ(t.code[1], 0) << t.out[1];
  EXPECT_NE(t.out[0].find("waiting for the other nodes"), std::string::npos) << t.out[0];
  EXPECT_NE(t.out[0].find("attempt 0 failed: rank 1 (node 1) exited with code 4"), std::string::npos) << t.out[0];
  EXPECT_EQ(count(t.out[0], "ENV TORCHELASTIC_RESTART_COUNT=1"), 1u) << t.out[0];
  EXPECT_EQ(count(t.out[1], "ENV TORCHELASTIC_RESTART_COUNT=1"), 1u) << t.out[1];
}

TEST(Launch, TwoNodesSigtermOnOneStopsBoth) {
  TempDir tmp;
  int port = free_port();
  Child node[2];
  for (int k : {0, 1})
    node[k] = start({"--nnodes", "2", "--node-rank", std::to_string(k), "--master-port", std::to_string(port),
                     "--log-dir", tmp / "logs", "--monitor-interval", "0.1", "--grace-period", "2", "--", kWorker,
                     "--sleep", "60"},
                    tmp / ("node" + std::to_string(k)), tmp / ("node" + std::to_string(k)));
  for (int k : {0, 1})
    ASSERT_TRUE(wait_until_count(tmp / ("node" + std::to_string(k)), "worker rank=", 1)) << read_text(tmp / "node0");
  node[1].proc.signal(SIGTERM);
  EXPECT_EQ(finish(node[1], 30), 128 + SIGTERM) << read_text(tmp / "node1");
  EXPECT_EQ(finish(node[0], 30), 128 + SIGTERM) << read_text(tmp / "node0");
  EXPECT_NE(read_text(tmp / "node0").find("[rank0]: rank 0 got SIGTERM"), std::string::npos) << read_text(tmp / "node0");
  EXPECT_NE(read_text(tmp / "node0").find("node 1 received SIGTERM"), std::string::npos) << read_text(tmp / "node0");
  EXPECT_NE(read_text(tmp / "node1").find("[rank1]: rank 1 got SIGTERM"), std::string::npos) << read_text(tmp / "node1");
}

TEST(Launch, RendezvousTimeoutNamesMissingNode) {
  TempDir tmp;
  auto r = launch({"--nnodes", "2", "--node-rank", "0", "--master-port", std::to_string(free_port()),
                   "--rdzv-timeout", "1", "--log-dir", tmp / "logs", "--", kWorker});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_NE(r.out.find("waiting for node(s) 1"), std::string::npos) << r.out;
}

// Real torch.distributed workers on two "nodes": env:// (rank 0 hosts the c10d store at
// MASTER_ADDR:MASTER_PORT, the others connect), a gloo all-reduce, and again after a restart of the
// whole group on a new port. env:// honours USE_LIBUV=0, so this runs on Debian's libuv-less torch
// 2.x too (torchrun's own stores ask for libuv whatever USE_LIBUV says: SameVariablesAsTorchrun skips).
TEST(Launch, RealTorchWorkersAllReduceAcrossNodesAndRestart) {
  if (lm::test::run_bin("/usr/bin/python3", {"-c", "import torch.distributed"}).exit_code != 0)
    GTEST_SKIP() << "no torch for /usr/bin/python3";
  TempDir tmp;
  write_text(tmp / "w.py",
             "import os, sys, torch, torch.distributed as dist\n"
             "os.environ.setdefault('USE_LIBUV', '0')  # Debian's torch 2.x has no libuv (1.13 ignores it)\n"
             "dist.init_process_group('gloo')\n"
             "rank, world = dist.get_rank(), dist.get_world_size()\n"
             "t = torch.tensor([rank + 1.0])\n"
             "dist.all_reduce(t)\n"
             "attempt = int(os.environ['TORCHELASTIC_RESTART_COUNT'])\n"
             "print(f'sum={t.item()} rank={rank} world={world} attempt={attempt}', flush=True)\n"
             "dist.destroy_process_group()\n"
             "sys.exit(3 if attempt == 0 and rank == 1 else 0)\n");
  auto t = run_two_nodes(tmp, "torch", {"--nproc-per-node", "1", "--max-restarts", "1"},
                         {"/usr/bin/python3", tmp / "w.py"});
  if (t.code[0] != 0 && !lm::test::python_torch_lacks_libuv(t.out[0]).empty())
    GTEST_SKIP() << lm::test::python_torch_lacks_libuv(t.out[0]);
  ASSERT_EQ(t.code[0], 0) << t.out[0];
  ASSERT_EQ(t.code[1], 0) << t.out[1];
  for (int attempt : {0, 1}) {
    EXPECT_NE(t.out[0].find("[rank0]: sum=3.0 rank=0 world=2 attempt=" + std::to_string(attempt)), std::string::npos)
        << t.out[0];
    EXPECT_NE(t.out[1].find("[rank1]: sum=3.0 rank=1 world=2 attempt=" + std::to_string(attempt)), std::string::npos)
        << t.out[1];
  }
  EXPECT_NE(t.out[0].find("attempt 0 failed: rank 1 (node 1) exited with code 3"), std::string::npos) << t.out[0];
}

// One node with a fixed --master-port: every attempt's rank 0 hosts the store on that same port.
// Attempt 0: rank 1 fails after the all-reduce (rank 0's store served connections: the restart
// binds the port again). Attempt 1: rank 0 fails before its store is up while rank 1 waits to
// connect (the launcher stops rank 1). Attempt 2 succeeds. Checked to fail with a free port per
// attempt for one node.
TEST(Launch, RealTorchWorkersRestartOnTheSamePort) {
  if (lm::test::run_bin("/usr/bin/python3", {"-c", "import torch.distributed"}).exit_code != 0)
    GTEST_SKIP() << "no torch for /usr/bin/python3";
  TempDir tmp;
  write_text(tmp / "w.py",
             "import os, sys, torch, torch.distributed as dist\n"
             "attempt, rank = int(os.environ['TORCHELASTIC_RESTART_COUNT']), int(os.environ['RANK'])\n"
             "if attempt == 1 and rank == 0: sys.exit(4)\n"
             "os.environ.setdefault('USE_LIBUV', '0')  # Debian's torch 2.x has no libuv (1.13 ignores it)\n"
             "dist.init_process_group('gloo')\n"
             "t = torch.tensor([rank + 1.0])\n"
             "dist.all_reduce(t)\n"
             "print(f'sum={t.item()} rank={rank} attempt={attempt}', flush=True)\n"
             "dist.destroy_process_group()\n"
             "sys.exit(3 if attempt == 0 and rank == 1 else 0)\n");
  const int port = free_port();
  auto r = launch({"--nproc-per-node", "2", "--master-port", std::to_string(port), "--max-restarts", "2",
                   "--monitor-interval", "0.1", "--grace-period", "2", "--log-dir", tmp / "logs", "--",
                   "/usr/bin/python3", tmp / "w.py"});
  if (r.exit_code != 0 && !lm::test::python_torch_lacks_libuv(r.out).empty())
    GTEST_SKIP() << lm::test::python_torch_lacks_libuv(r.out);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(master_ports(r.out), (std::map<int, int>{{0, port}, {1, port}, {2, port}})) << r.out;
  for (int attempt : {0, 2})
    for (int rank : {0, 1})
      EXPECT_NE(r.out.find(lm::strf("[rank%d]: sum=3.0 rank=%d attempt=%d", rank, rank, attempt)), std::string::npos)
          << r.out;
  EXPECT_NE(r.out.find("attempt 0 failed: rank 1 (node 0) exited with code 3"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attempt 1 failed: rank 0 (node 0) exited with code 4"), std::string::npos) << r.out;
}

// ---- bad input --------------------------------------------------------------------------------------

}  // namespace
