// The launcher's torch-free store (launch/launcher/store.h) against real c10d::TCPStore clients of
// the LibTorch this test is built with (1.13: the 1.x dialect; 2.x in CI via launch/torch2.sh: the
// 2.x dialect with VALIDATE, PING, CANCEL_WAIT, append and the multi-key calls), against its own
// client, with the server gone, and byte by byte where no client of this LibTorch can reach
// (queues, refused query types, the 1.x numbering under a 2.x build). Only this test links LibTorch.
#include <arpa/inet.h>
#include <pthread.h>
#include <signal.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/errors.h"
#include "common/torch/compat.h"
#include "launch/launcher/store.h"
#include "tests/testutil.h"

namespace {

using lm::launch::StoreClient;
using lm::launch::StoreServer;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string str(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

// A c10d client of this LibTorch, as the trainer makes one (compat::tcp_store: no libuv needed).
c10::intrusive_ptr<c10d::TCPStore> c10d_client(int port, std::chrono::milliseconds timeout = 10s) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(port);
  so.isServer = false;
  so.waitWorkers = false;
  so.timeout = timeout;
  return lm::compat::tcp_store("127.0.0.1", so);
}

using lm::clock::seconds_since;

TEST(Store, RealClientEveryCall) {
  StoreServer server(0);
  auto s = c10d_client(server.port());
  s->set("a", bytes("1"));
  EXPECT_EQ(str(s->get("a")), "1");
  EXPECT_EQ(s->add("n", 5), 5);  // a missing key counts as 0
  EXPECT_EQ(s->add("n", -2), 3);
  EXPECT_EQ(str(s->get("n")), "3");  // kept as decimal text
  EXPECT_TRUE(s->check({"a", "n"}));
  EXPECT_FALSE(s->check({"a", "missing"}));
  s->wait({"a", "n"});  // all there: returns at once
  EXPECT_EQ(str(s->compareSet("a", bytes("1"), bytes("2"))), "2");        // expected: swapped
  EXPECT_EQ(str(s->compareSet("a", bytes("1"), bytes("3"))), "2");        // not expected: unchanged
  EXPECT_EQ(str(s->compareSet("c", bytes(""), bytes("new"))), "new");     // missing, expected empty: set
  EXPECT_EQ(str(s->compareSet("d", bytes("x"), bytes("new"))), "x");      // missing otherwise: not set
  EXPECT_FALSE(s->check({"d"}));
  EXPECT_EQ(s->getNumKeys(), 3);  // a, n, c
  EXPECT_TRUE(s->deleteKey("c"));
  EXPECT_FALSE(s->deleteKey("c"));
  EXPECT_EQ(s->getNumKeys(), 2);
  std::string big(3 << 20, 'x');  // spans many reads and writes
  s->set("big", bytes(big));
  EXPECT_EQ(str(s->get("big")), big);
#if LM_TORCH_AT_LEAST(2, 0)
  s->append("log", bytes("ab"));
  s->append("log", bytes("cd"));
  EXPECT_EQ(str(s->get("log")), "abcd");
  s->multiSet({"m1", "m2"}, {bytes("x"), bytes("")});
  auto got = s->multiGet({"m1", "m2", "a"});
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(str(got[0]), "x");
  EXPECT_EQ(str(got[1]), "");
  EXPECT_EQ(str(got[2]), "2");
#endif
}

// What ProcessGroupGloo/NCCL and torchrun's workers do: a PrefixStore over the agent's store.
TEST(Store, RealPrefixStoreBarrier) {
  StoreServer server(0);
  auto base = c10d_client(server.port());
  auto p = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_0", base);
  auto q = c10::make_intrusive<c10d::PrefixStore>("/worker/attempt_0", c10d_client(server.port()));
  EXPECT_EQ(p->add("barrier", 1), 1);
  EXPECT_EQ(q->add("barrier", 1), 2);
  q->set("addr/1", bytes("host:1234"));
  EXPECT_EQ(str(p->get("addr/1")), "host:1234");
  EXPECT_TRUE(base->check({"/worker/attempt_0/barrier"}));
}

TEST(Store, RealWaitBlocksUntilAnotherClientSets) {
  StoreServer server(0);
  auto waiter = c10d_client(server.port());
  auto setter = c10d_client(server.port());
  auto t0 = Clock::now();
  auto done = std::async(std::launch::async, [&] { waiter->wait({"k1", "k2"}); });
  setter->set("k1", bytes("1"));
  EXPECT_EQ(done.wait_for(300ms), std::future_status::timeout) << "k2 is still missing";
  setter->set("k2", bytes("2"));
  ASSERT_EQ(done.wait_for(5s), std::future_status::ready);
  done.get();
  EXPECT_LT(seconds_since(t0), 5.0);
  // get() waits the same way.
  auto value = std::async(std::launch::async, [&] { return str(waiter->get("later")); });
  EXPECT_EQ(value.wait_for(200ms), std::future_status::timeout);
  EXPECT_EQ(setter->add("later", 7), 7);  // ADD wakes waiters too
  EXPECT_EQ(value.get(), "7");
}

TEST(Store, RealWaitTimesOut) {
  StoreServer server(0);
  auto s = c10d_client(server.port());
  auto t0 = Clock::now();
  EXPECT_THROW(s->wait({"never"}, 300ms), std::exception);
  EXPECT_GE(seconds_since(t0), 0.25);
  EXPECT_LT(seconds_since(t0), 5.0);
#if LM_TORCH_AT_LEAST(2, 0)
  // The 2.x client cancels its wait (CANCEL_WAIT), so the connection stays in step.
  s->set("after", bytes("ok"));
  EXPECT_EQ(str(s->get("after")), "ok");
#endif
  // Another client is unaffected either way.
  auto other = c10d_client(server.port());
  other->set("never", bytes("1"));
  EXPECT_TRUE(other->check({"never"}));
}

// The launchers' own client: the same keys as c10d's (prefix "/").
TEST(Store, OwnClientAgainstServerAndC10d) {
  StoreServer server(0);
  StoreClient ours("127.0.0.1", server.port(), 2s);
  auto theirs = c10d_client(server.port());
  ours.set("launch/x", "node 1");
  EXPECT_EQ(str(theirs->get("launch/x")), "node 1");
  theirs->set("from_c10d", bytes("v"));
  EXPECT_EQ(ours.get("from_c10d"), "v");
  EXPECT_EQ(ours.add("count", 2), 2);
  EXPECT_EQ(theirs->add("count", 1), 3);
  EXPECT_EQ(ours.add("count", 0), 3);
  EXPECT_TRUE(ours.check({"launch/x", "count"}));
  EXPECT_FALSE(ours.check({"launch/x", "nope"}));
  StoreClient impatient("localhost", server.port(), 300ms);  // by name, IPv6 or IPv4
  try {
    impatient.get("nope");
    ADD_FAILURE() << "get of a missing key returned";
  } catch (const lm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after 0.3 s waiting for key 'nope'"), std::string::npos)
        << e.what();
  }
  impatient.set("nope", "now");  // the timed-out wait was cancelled: the connection is still in step
  EXPECT_EQ(impatient.get("nope"), "now");
}

// The launcher's thread takes SIGCHLD whenever a worker exits, also in the middle of a store call:
// an interrupted poll() is neither a timeout nor an error (a handler without SA_RESTART, as the
// launcher's, interrupts it).
TEST(Store, ASignalDuringACallIsNotATimeout) {
  struct sigaction sa {}, old{};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;
  ASSERT_EQ(::sigaction(SIGUSR1, &sa, &old), 0);
  StoreServer server(0);
  StoreClient waiter("127.0.0.1", server.port(), 5s);
  StoreClient setter("127.0.0.1", server.port(), 5s);
  const pthread_t self = ::pthread_self();
  std::thread t([&] {
    for (int i = 0; i < 20; ++i) {
      ::pthread_kill(self, SIGUSR1);
      std::this_thread::sleep_for(10ms);
    }
    setter.set("late", "v");
  });
  std::string got;
  try {
    got = waiter.get("late");
  } catch (const lm::Error& e) {
    ADD_FAILURE() << e.what();
  }
  t.join();
  ::sigaction(SIGUSR1, &old, nullptr);
  EXPECT_EQ(got, "v");
}

TEST(Store, ServerGoneIsAClearError) {
  auto server = std::make_unique<StoreServer>(0);
  const int port = server->port();
  StoreClient c("127.0.0.1", port, 2s);
  c.set("k", "v");
  server.reset();
  try {
    c.check({"k"});
    ADD_FAILURE() << "check() with the server gone returned";
  } catch (const lm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("closed the connection"), std::string::npos) << e.what();
  }
  auto t0 = Clock::now();
  try {
    StoreClient late("127.0.0.1", port, 300ms);
    ADD_FAILURE() << "connected to nothing";
  } catch (const lm::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no store answered within"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 5.0);
}

TEST(Store, PortInUseIsAnError) {
  StoreServer a(0);
  EXPECT_THROW(StoreServer b(a.port()), lm::Error);
}

// ---- byte by byte --------------------------------------------------------------------------------

// A raw connection to the server, for what no client of this LibTorch sends.
class Raw {
 public:
  explicit Raw(int port) : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    EXPECT_EQ(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  }
  ~Raw() { ::close(fd_); }
  Raw& u8(uint8_t v) { return raw(&v, 1); }
  Raw& u32(uint32_t v) { return raw(&v, 4); }
  Raw& u64(uint64_t v) { return raw(&v, 8); }
  Raw& s(const std::string& v) { return u64(v.size()).raw(v.data(), v.size()); }
  Raw& validate() { return u8(0).u32(0x3C85F7CE); }  // the 2.x dialect
  void send() {
    ASSERT_EQ(::write(fd_, out_.data(), out_.size()), static_cast<ssize_t>(out_.size()));
    out_.clear();
  }
  // The next n bytes, or "" when nothing came within `ms` or the server closed the connection.
  std::string recv(size_t n, int ms = 3000) {
    std::string b;
    while (b.size() < n) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, ms) != 1) return "";
      char c[256];
      ssize_t got = ::read(fd_, c, std::min(sizeof c, n - b.size()));
      if (got <= 0) return "";
      b.append(c, static_cast<size_t>(got));
    }
    return b;
  }
  int64_t i64() {
    std::string b = recv(8);
    int64_t v = -1;
    if (b.size() == 8) std::memcpy(&v, b.data(), 8);
    return v;
  }
  bool closed_by_server() {
    pollfd p{fd_, POLLIN, 0};
    char c;
    return ::poll(&p, 1, 3000) == 1 && ::read(fd_, &c, 1) == 0;
  }

 private:
  Raw& raw(const void* p, size_t n) {
    out_.append(static_cast<const char*>(p), n);
    return *this;
  }
  int fd_;
  std::string out_;
};

// 2.x query types (store.h).
enum : uint8_t { kSet2 = 1, kCheck2 = 5, kWait2 = 6, kCancel2 = 12, kPing2 = 13, kPush = 14, kPop = 15, kLen = 16 };

TEST(Store, RawPingAndQueues) {
  StoreServer server(0);
  Raw a(server.port()), b(server.port());
  a.validate().u8(kPing2).u32(0xdeadbeef).send();  // VALIDATE has no reply; PING echoes
  uint32_t echo = 0;
  std::string r = a.recv(4);
  ASSERT_EQ(r.size(), 4u);
  std::memcpy(&echo, r.data(), 4);
  EXPECT_EQ(echo, 0xdeadbeefu);
  b.validate().send();
  a.u8(kLen).s("/q").send();
  EXPECT_EQ(a.i64(), 0);
  a.u8(kPop).s("/q").send();  // empty: the length only
  EXPECT_EQ(a.i64(), 0);
  a.u8(kWait2).u64(1).s("/q").send();  // a blocking pop waits for the queue
  EXPECT_EQ(a.recv(1, 200), "");
  b.u8(kPush).s("/q").s("first").u8(kPush).s("/q").s("second").send();
  EXPECT_EQ(a.recv(1), std::string(1, '\0')) << "STOP_WAITING after the push";
  a.u8(kLen).s("/q").send();
  EXPECT_EQ(a.i64(), 2);
  a.u8(kPop).s("/q").send();
  EXPECT_EQ(a.i64(), 2);  // the length before the pop, then the value
  EXPECT_EQ(a.i64(), 5);
  EXPECT_EQ(a.recv(5), "first");
  a.u8(kCheck2).u64(1).s("/q").send();
  EXPECT_EQ(a.recv(1), std::string(1, '\0')) << "a non-empty queue counts as existing";
  a.u8(kWait2).u64(1).s("/none").u8(kCancel2).send();
  EXPECT_EQ(a.recv(1), std::string(1, '\1')) << "WAIT_CANCELED, and nothing else";
  EXPECT_EQ(a.recv(1, 200), "");
  b.u8(kSet2).s("/none").s("x").send();
  EXPECT_EQ(a.recv(1, 200), "") << "a cancelled wait is not woken";
}

TEST(Store, RawOneDotXNumberingAndRefusals) {
  StoreServer server(0);
  Raw v1(server.port());
  v1.u8(0).s("/k").s("v").u8(2).s("/k").send();  // 1.13: SET=0, GET=2
  EXPECT_EQ(v1.i64(), 1);
  EXPECT_EQ(v1.recv(1), "v");
  v1.u8(3).s("/n").u64(4).send();  // ADD=3
  EXPECT_EQ(v1.i64(), 4);
  v1.u8(6).send();  // GETNUMKEYS=6
  EXPECT_EQ(v1.i64(), 2);
  v1.u8(7).s("/k").send();  // WATCH_KEY: not supported
  EXPECT_TRUE(v1.closed_by_server());
  Raw v2(server.port());
  v2.validate().u8(99).send();
  EXPECT_TRUE(v2.closed_by_server());
  Raw garbage(server.port());
  garbage.u8(0).u64(uint64_t{1} << 40).send();  // a key of a TiB
  EXPECT_TRUE(garbage.closed_by_server());
  StoreClient still("127.0.0.1", server.port(), 2s);  // the server serves on
  EXPECT_EQ(still.get("k"), "v");
}

}  // namespace
