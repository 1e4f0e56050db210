// The rendezvous store without LibTorch: a server that speaks c10d's TCPStore wire protocol (node
// 0's launcher hosts it; the workers' c10d::TCPStore clients, LibTorch 1.13 and 2.x, C++ and
// Python, connect to it) and a small client for the launchers (launcher.cpp).
//
// ---- The wire protocol (what the server implements) --------------------------------------------
// A connection carries queries from the client; each is one byte of query type, then its
// arguments; some queries have a reply. Integers are in host byte order (little-endian on every
// platform LibTorch ships for): a string or byte vector is a uint64 length then the bytes; a key
// count is a uint64; ADD's delta and every int64 reply are int64.
//
// Two dialects, told apart by the first bytes of a connection:
//   2.x  the first query is VALIDATE (0) with the uint32 magic 0x3C85F7CE (bytes CE F7 85 3C); the
//        client then sends PING. Query types:
//          0 VALIDATE 1 SET 2 COMPARE_SET 3 GET 4 ADD 5 CHECK 6 WAIT 7 GETNUMKEYS 8 DELETE_KEY
//          9 APPEND 10 MULTI_GET 11 MULTI_SET 12 CANCEL_WAIT 13 PING 14 QUEUE_PUSH 15 QUEUE_POP
//          16 QUEUE_LEN   (queues: newer than 2.6, libuv server only)
//   1.x  anything else (1.13 sends no VALIDATE; its first byte is a query). Query types:
//          0 SET 1 COMPARE_SET 2 GET 3 ADD 4 CHECK 5 WAIT 6 GETNUMKEYS 7 WATCH_KEY 8 DELETE_KEY
//          (2.0/2.1 added 9 APPEND 10 MULTI_GET 11 MULTI_SET 12 CANCEL_WAIT; accepted too)
//        A 1.13 SET starts with byte 0 followed by a uint64 key length, whose low four bytes would
//        have to equal the magic (a key of ~1 GB) to be mistaken for 2.x: the test is safe.
// Queries (-> reply):
//   SET key value
//   COMPARE_SET key expected desired -> vector: the value after; a missing key is set to desired
//                                    when expected is empty, else stays missing (reply: expected)
//   GET key -> vector (empty when missing: clients WAIT first)
//   ADD key int64 -> int64: the sum; the value is kept as decimal text, a missing key counts as 0
//   CHECK n keys -> uint8 0 READY (all exist) / 1 NOT_READY
//   WAIT n keys -> uint8 0 STOP_WAITING, once every key exists (at once, or when the last is set)
//   GETNUMKEYS -> int64          DELETE_KEY key -> int64 (0 or 1)
//   APPEND key value (creates)   MULTI_GET n keys -> n vectors   MULTI_SET n (key value)...
//   CANCEL_WAIT -> uint8 1 WAIT_CANCELED (a STOP_WAITING sent just before it is read first)
//   PING uint32 -> the same uint32
//   QUEUE_PUSH key value         QUEUE_LEN key -> int64
//   QUEUE_POP key -> int64 length before the pop, then the popped vector when it was > 0
//   A key with a non-empty queue exists for CHECK and WAIT (a blocking pop WAITs first);
//   QUEUE_PUSH wakes one waiter. SET, ADD, APPEND, COMPARE_SET and MULTI_SET wake all.
// Clients serialize their queries; a 2.x client whose WAIT times out sends CANCEL_WAIT, a 1.13
// client just stops reading (its socket timeout), so a new WAIT replaces a connection's old one.
// Not implemented (refused like any unknown type: the connection is closed with one log line):
// 1.x WATCH_KEY (watchKey(), never used by the process groups or torchrun's workers).
//
// Sources read (pytorch/pytorch, torch/csrc/distributed/c10d/): TCPStoreBackend.hpp of 2.6 as
// Debian 13's libtorch-dev 2.6 installs it (the enum, the magic, PING); TCPStore.cpp,
// TCPStoreBackend.cpp, TCPStoreLibUvBackend.cpp and TCPStoreBackend.hpp of a recent main with
// QUEUE_* (as reproduced in rbarfinezhadfeli0/pytorch docs/ @0edb999); TCPStore.cpp of the 2.0
// era (the 1.x numbering with WATCH_KEY and APPEND..CANCEL_WAIT; commit b874478) and of 1.8
// (doWait without CANCEL_WAIT); LibTorch 1.13's installed TCPStore.hpp and Store.hpp (watchKey;
// no append, multiGet, multiSet). Checked against real clients: tests/launch/store_test.cpp with
// LibTorch 1.13 (here) and 2.6 (launch/torch2.sh), and by hand with Python torch 1.13 and 2.6
// (gloo over it).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lm::launch {

// The server, on a thread of its own (single-threaded poll() over all connections); thread-safe
// in the sense that it shares nothing with the caller's threads. Keeps every key in memory.
class StoreServer {
 public:
  // Listens on `port` (0: a free one) on every interface, IPv6 and IPv4 (IPv4 only where the host
  // has no IPv6). Throws Error naming the port and the reason when it cannot.
  explicit StoreServer(int port);
  // Stops the thread and closes every connection (clients then fail with "closed").
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// A client in the 2.x dialect, with c10d's key prefix "/" (so a c10d client sees the same keys).
// One connection; not thread-safe. Every call waits at most `timeout` for the server and throws
// Error ("timed out ...", "the store closed the connection", ...) when the server is gone or slow.
class StoreClient {
 public:
  // Connects to host:port, retrying while nothing listens there yet (node 0 may start later), up to
  // `timeout`; then VALIDATE and PING. Throws Error when the time is up or the peer is no store.
  StoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~StoreClient();
  StoreClient(const StoreClient&) = delete;
  StoreClient& operator=(const StoreClient&) = delete;

  void set(const std::string& key, const std::string& value);
  // Waits (up to the timeout) for the key, then returns its value.
  std::string get(const std::string& key);
  // Adds `delta` to the key's integer value (missing: 0) and returns the sum.
  int64_t add(const std::string& key, int64_t delta);
  // Whether every key exists (no waiting).
  bool check(const std::vector<std::string>& keys);

 private:
  void send_all(const std::string& bytes);
  std::string recv_exact(size_t n);
  template <typename T>
  T recv_value();

  int fd_ = -1;
  std::chrono::milliseconds timeout_;
  std::string where_;  // "host:port" for messages
};

}  // namespace lm::launch
