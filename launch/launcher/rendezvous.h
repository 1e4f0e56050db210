// How the launchers of one job agree on each attempt of the worker group: a small line protocol of
// their own, served by node 0's launcher. The workers never see it: they get MASTER_ADDR and
// MASTER_PORT, and their rank 0 hosts the c10d store there, as with plain torch.distributed.
//
// ---- The protocol "lmlaunch/1" ------------------------------------------------------------------
// One TCP connection per node k > 0 to node 0's --rdzv-endpoint (default MASTER_ADDR:MASTER_PORT);
// node 0 talks to the same Coordinator in-process. Each request is one text line; node 0 answers
// each with one line at once (nothing blocks: launchers poll, every 20 ms while they wait and every
// --monitor-interval while workers run). A reply "ERR <text>" refuses the request.
//   HELLO lmlaunch/1 run=<id> node=<k> nnodes=<N> max_restarts=<M>  -> OK lmlaunch/1
//                       (refused: other protocol version, run id, nnodes or max_restarts; a node
//                        rank out of range or already connected)
//   JOIN <a> <nproc>    -> WAIT <missing nodes, comma-separated> | GO <port> <nproc_0>,...,<nproc_N-1>
//                          | STOP <signal> <node>
//                       node k is ready for attempt a; GO once every node is: <port> is the
//                       workers' MASTER_PORT of attempt a (picked on node 0 when the last node joins:
//                       --master-port with one node unless --standalone, else a free port, new for
//                       every attempt)
//   DONE <a>            -> OK      all of this node's workers exited 0 in attempt a
//   FAIL <a> <failure>  -> FAILED <the attempt's first failure>   (workers.h: Failure::encode)
//   POLL <a>            -> RUN | DONE (every node is done) | FAILED <failure> | STOP <signal> <node>
//   STOP <signal>       -> OK      this node got SIGINT/SIGTERM/SIGHUP: every node stops
//   END                 -> OK      this node is finished; ENDED -> <nodes finished or disconnected>
// A node whose connection closes before END counts as finished, and fails the attempt it was in
// ("launcher disconnected"). Node 0 stays up after its own END until every node ended (bounded).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "launch/launcher/options.h"
#include "launch/launcher/workers.h"

namespace lm::launch {

inline constexpr const char* kProtocol = "lmlaunch/1";

// The job's state for all nodes (node 0 only). Thread-safe: node 0's launcher and the server's
// thread call it.
class Coordinator {
 public:
  // `fixed_port`: the workers' MASTER_PORT for every attempt; 0: a free port of this host, new for
  // every attempt.
  Coordinator(const Options& o, int fixed_port);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // One request line of `*node`'s connection (-1 until its HELLO, which sets it) -> the reply line.
  std::string handle(int* node, const std::string& line);
  // `node`'s connection closed (before END: it counts as ended and fails its attempt).
  void lost(int node);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// Serves `coord` on `port` of every interface (IPv6 and IPv4), on a thread of its own. Throws Error
// naming the port when it cannot listen.
class CoordServer {
 public:
  CoordServer(Coordinator& coord, int port);
  ~CoordServer();  // stops the thread and closes every connection
  CoordServer(const CoordServer&) = delete;
  CoordServer& operator=(const CoordServer&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// How the launcher sees an attempt.
struct Poll {
  enum Kind { kWait, kGo, kRunning, kDone, kFailed, kStopped } kind = kWait;
  std::vector<int> missing;    // kWait: nodes not there yet
  int port = 0;                // kGo: the workers' MASTER_PORT
  std::vector<int> node_nproc; // kGo: workers per node
  Failure failure;             // kFailed: the attempt's first failure
  int signal = 0, node = -1;   // kStopped: the signal, and the node that got it
};

// A launcher's side of the protocol: in-process on node 0, over TCP elsewhere. Every call throws
// Error when node 0 is gone or does not answer within the call timeout.
class Peer {
 public:
  // Node 0: talks to `coord` directly.
  Peer(const Options& o, Coordinator& coord);
  // Other nodes: connects to host:port (retrying while nothing listens there, up to
  // `connect_timeout`). Each reply must come within `call_timeout`.
  Peer(const Options& o, const std::string& host, int port, std::chrono::milliseconds connect_timeout,
       std::chrono::milliseconds call_timeout);
  ~Peer();
  Peer(const Peer&) = delete;
  Peer& operator=(const Peer&) = delete;

  // Throws UsageError when node 0 refuses this node (the options disagree).
  void hello();
  Poll join(int attempt, int nproc);
  void done(int attempt);
  Failure fail(int attempt, const Failure& f);  // -> the attempt's first failure
  Poll poll(int attempt);
  void stop(int signal);
  void end();
  int ended();

 private:
  std::string call(const std::string& line);      // the reply; throws UsageError on "ERR ..."
  std::string exchange(const std::string& line);  // over TCP
  Poll parse_poll(const std::string& reply);

  const Options& o_;
  Coordinator* coord_ = nullptr;
  int node_ = -1;  // in-process: the session's node
  int fd_ = -1;    // over TCP
  std::string buf_;
  std::string where_;
  std::chrono::milliseconds call_timeout_{0};
};

// A port of this host that is free now (bound and released), for the workers' store.
int free_port();

}  // namespace lm::launch
