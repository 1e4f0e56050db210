// The launchers' rendezvous protocol (launch/launcher/rendezvous.h): node 0's Coordinator through
// in-process peers, and its server through peers over loopback (a lost node, a peer that is no
// launcher, node 0 gone). The launcher's behaviour end to end is in launch_test.cpp.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "common/errors.h"
#include "launch/launcher/rendezvous.h"
#include "tests/testutil.h"

namespace lm::launch {
namespace {

using namespace std::chrono_literals;

Options node_options(int node, int nnodes = 2, const std::string& run_id = "job", int max_restarts = 1) {
  Options o;
  o.node_rank = node;
  o.nnodes = nnodes;
  o.run_id = run_id;
  o.max_restarts = max_restarts;
  return o;
}

// A message of the exception `f` throws, or "" when it throws none.
template <typename F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool port_bindable(int port) {
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  bool ok = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(s);
  return ok;
}

TEST(Rendezvous, JoinWaitsForEveryNodeThenAssignsOnePort) {
  Options o0 = node_options(0), o1 = node_options(1);
  Coordinator coord(o0, /*fixed_port=*/0);
  Peer n0(o0, coord), n1(o1, coord);
  n0.hello();
  n1.hello();
  int previous_port = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    Poll w = n0.join(attempt, 2);
    ASSERT_EQ(w.kind, Poll::kWait);
    EXPECT_EQ(w.missing, std::vector<int>{1});
    Poll g1 = n1.join(attempt, 3);
    ASSERT_EQ(g1.kind, Poll::kGo);
    EXPECT_EQ(g1.node_nproc, (std::vector<int>{2, 3}));
    Poll g0 = n0.join(attempt, 2);  // joining again is harmless: the same answer
    ASSERT_EQ(g0.kind, Poll::kGo);
    EXPECT_EQ(g0.port, g1.port);
    EXPECT_TRUE(port_bindable(g0.port)) << "a free port: " << g0.port;
    EXPECT_NE(g0.port, previous_port) << "a new port for every attempt";
    previous_port = g0.port;
    n0.done(attempt);
    EXPECT_EQ(n1.poll(attempt).kind, Poll::kRunning) << "node 1 is not done yet";
    n1.done(attempt);
    EXPECT_EQ(n0.poll(attempt).kind, Poll::kDone);
  }
}

TEST(Rendezvous, OneNodeKeepsTheGivenPort) {
  Options o = node_options(0, 1);
  Coordinator coord(o, 29512);
  Peer n0(o, coord);
  n0.hello();
  for (int attempt = 0; attempt < 2; ++attempt) {
    Poll g = n0.join(attempt, 4);
    ASSERT_EQ(g.kind, Poll::kGo);
    EXPECT_EQ(g.port, 29512);
    EXPECT_EQ(g.node_nproc, std::vector<int>{4});
  }
}

TEST(Rendezvous, HelloRefusesNodesThatDisagree) {
  Options o0 = node_options(0);
  Coordinator coord(o0, 0);
  Peer n0(o0, coord);
  n0.hello();
  Options other_run = node_options(1, 2, "other"), other_nnodes = node_options(1, 3), other_restarts = node_options(1, 2, "job", 4);
  Peer a(other_run, coord), b(other_nnodes, coord), c(other_restarts, coord);
  EXPECT_NE(usage_error_of([&] { a.hello(); }).find("--run-id job --nnodes 2 --max-restarts 1, this node with other, 2 and 1"),
            std::string::npos);
  EXPECT_NE(usage_error_of([&] { b.hello(); }).find("this node with job, 3 and 1"), std::string::npos);
  EXPECT_NE(usage_error_of([&] { c.hello(); }).find("this node with job, 2 and 4"), std::string::npos);
  Options again = node_options(0);
  Peer twice(again, coord);
  EXPECT_NE(usage_error_of([&] { twice.hello(); }).find("node 0 already joined"), std::string::npos);
  Peer nobody(node_options(1), coord);
  EXPECT_NE(usage_error_of([&] { nobody.join(0, 1); }).find("HELLO first"), std::string::npos);
}

// Whatever a connection sends, node 0 answers ERR and keeps the job's state (a request that threw
// would end node 0's launch from its server thread). Checked to fail with the FAIL check removed
// (std::out_of_range escapes handle()) and with STOP accepting any signal.
TEST(Rendezvous, MalformedRequestsAreRefused) {
  Options o0 = node_options(0);
  Coordinator coord(o0, 0);
  int node = -1;
  EXPECT_EQ(coord.handle(&node, "JOIN 0 1"), "ERR HELLO first");
  EXPECT_EQ(coord.handle(&node, "HELLO lmlaunch/1 run=job node=1 nnodes=2 max_restarts=1"), "OK lmlaunch/1");
  EXPECT_EQ(node, 1);
  for (const char* bad : {"FAIL 0", "FAIL 0   ", "FAIL", "JOIN", "JOIN 0", "JOIN 0 0", "JOIN -1 1", "POLL x", "STOP",
                          "STOP x", "STOP 0", "NOPE", ""})
    EXPECT_EQ(coord.handle(&node, bad).rfind("ERR ", 0), 0u) << "'" << bad << "'";
  EXPECT_EQ(coord.handle(&node, "POLL 0"), "RUN") << "no failure and no stop recorded";
}

TEST(Rendezvous, FirstFailureWinsOnEveryNode) {
  Options o0 = node_options(0), o1 = node_options(1);
  Coordinator coord(o0, 0);
  Peer n0(o0, coord), n1(o1, coord);
  n0.hello();
  n1.hello();
  n0.join(0, 1);
  n1.join(0, 1);
  Failure f1;
  f1.rank = 1, f1.node = 1, f1.local_rank = 0, f1.pid = 4242, f1.code = 137, f1.signal = 9;
  Failure f0;
  f0.rank = 0, f0.node = 0, f0.local_rank = 0, f0.pid = 77, f0.code = 3;
  EXPECT_EQ(n1.fail(0, f1).encode(), f1.encode());
  EXPECT_EQ(n0.fail(0, f0).encode(), f1.encode()) << "the first failure stays the attempt's";
  Poll p = n0.poll(0);
  ASSERT_EQ(p.kind, Poll::kFailed);
  EXPECT_EQ(p.failure.encode(), f1.encode());
  EXPECT_EQ(p.failure.how(), "was killed by SIGKILL (exit code 137)");
  // The next attempt starts clean.
  n0.join(1, 1);
  ASSERT_EQ(n1.join(1, 1).kind, Poll::kGo);
  EXPECT_EQ(n0.poll(1).kind, Poll::kRunning);
}

TEST(Rendezvous, StopReachesPollAndJoin) {
  Options o0 = node_options(0), o1 = node_options(1);
  Coordinator coord(o0, 0);
  Peer n0(o0, coord), n1(o1, coord);
  n0.hello();
  n1.hello();
  n0.join(0, 1);
  n1.join(0, 1);
  n1.stop(15);
  n0.stop(2);  // a later stop does not replace the first
  Poll p = n0.poll(0);
  ASSERT_EQ(p.kind, Poll::kStopped);
  EXPECT_EQ(p.signal, 15);
  EXPECT_EQ(p.node, 1);
  Poll j = n0.join(1, 1);
  ASSERT_EQ(j.kind, Poll::kStopped);
  EXPECT_EQ(j.node, 1);
}

// ---- over loopback ---------------------------------------------------------------------------

TEST(Rendezvous, OverTcpALostNodeFailsItsAttemptAndCountsAsEnded) {
  const int port = test::free_port();
  Options o0 = node_options(0, 3), o1 = node_options(1, 3), o2 = node_options(2, 3);
  Coordinator coord(o0, 0);
  CoordServer server(coord, port);
  Peer n0(o0, coord);
  n0.hello();
  auto n1 = std::make_unique<Peer>(o1, "127.0.0.1", port, 10s, 10s);
  Peer n2(o2, "localhost", port, 10s, 10s);
  n1->hello();
  n2.hello();
  n0.join(0, 1);
  n1->join(0, 2);
  Poll g = n2.join(0, 1);
  ASSERT_EQ(g.kind, Poll::kGo);
  EXPECT_EQ(g.node_nproc, (std::vector<int>{1, 2, 1}));
  EXPECT_EQ(n1->poll(0).kind, Poll::kRunning);
  n1.reset();  // node 1's launcher dies
  Poll p = n0.poll(0);
  for (int i = 0; i < 500 && p.kind == Poll::kRunning; ++i) {
    std::this_thread::sleep_for(10ms);
    p = n0.poll(0);
  }
  ASSERT_EQ(p.kind, Poll::kFailed);
  EXPECT_EQ(p.failure.rank, -1);
  EXPECT_EQ(p.failure.node, 1);
  EXPECT_EQ(n2.poll(0).kind, Poll::kFailed);
  n2.end();
  n0.end();
  EXPECT_EQ(n0.ended(), 3) << "node 1 is gone: it counts as ended";
}

TEST(Rendezvous, OverTcpWrongPeersAreOneLineErrors) {
  // Nothing listens: the connect retries until its timeout, then names the address.
  const int closed_port = test::free_port();
  try {
    Peer p(node_options(1), "127.0.0.1", closed_port, 300ms, 1s);
    FAIL() << "connected to nothing";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no launcher answered at 127.0.0.1:" + std::to_string(closed_port)),
              std::string::npos)
        << e.what();
  }
  // Something listens that never answers (e.g. a c10d store): the call times out.
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(s, 4), 0);
  socklen_t len = sizeof a;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  const int silent_port = ntohs(a.sin_port);
  {
    Peer p(node_options(1), "127.0.0.1", silent_port, 5s, 300ms);
    try {
      p.hello();
      FAIL() << "a silent peer answered";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no answer from 127.0.0.1:" + std::to_string(silent_port)),
                std::string::npos)
          << e.what();
    }
  }
  ::close(s);
  // Node 0 gone mid-run: the next call says the connection closed.
  const int port = test::free_port();
  Options o0 = node_options(0);
  auto coord = std::make_unique<Coordinator>(o0, 0);
  auto server = std::make_unique<CoordServer>(*coord, port);
  Peer n1(node_options(1), "127.0.0.1", port, 10s, 10s);
  n1.hello();
  server.reset();
  try {
    n1.poll(0);
    FAIL() << "node 0 is gone";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("closed the connection"), std::string::npos) << e.what();
  }
}

TEST(Rendezvous, ServerDropsGarbageAndKeepsServing) {
  const int port = test::free_port();
  Options o0 = node_options(0);
  Coordinator coord(o0, 0);
  CoordServer server(coord, port);
  // A line longer than any request, without a newline: the server closes that connection.
  int s = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  std::string junk(64 * 1024, 'x');
  ::send(s, junk.data(), junk.size(), MSG_NOSIGNAL);
  char b;
  EXPECT_LE(::recv(s, &b, 1, 0), 0) << "the server closes a connection that sends no lines";
  ::close(s);
  Peer n1(node_options(1), "127.0.0.1", port, 10s, 10s);
  n1.hello();
  EXPECT_EQ(n1.join(0, 1).kind, Poll::kWait);
}

TEST(Rendezvous, PortInUseIsAnError) {
  const int port = test::free_port();
  Options o0 = node_options(0);
  Coordinator coord(o0, 0);
  CoordServer first(coord, port);
  try {
    CoordServer second(coord, port);
    FAIL() << "two servers on one port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on port " + std::to_string(port)), std::string::npos);
  }
}

}  // namespace
}  // namespace lm::launch
