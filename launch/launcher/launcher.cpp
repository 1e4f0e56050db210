// The launcher of one node (see launcher.h).
//
// Rendezvous (like torchrun's static TCP rendezvous): the launcher of node 0 hosts the store
// (store.h: c10d's TCPStore protocol, without LibTorch) at MASTER_ADDR:MASTER_PORT; the launchers
// of all nodes, node 0's too, connect to it as clients. Workers get TORCHELASTIC_USE_AGENT_STORE=True
// and connect to the same store as c10d::TCPStore clients under the prefix
// "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" (the trainer does that part).
// The launchers keep their own keys under "launch/<run_id>/":
//   attempt_<n>/node_<k>     node k is ready for attempt n ("nproc=P max_restarts=M nnodes=N");
//                            every node waits for all of them, so attempt n starts together and
//                            global ranks are assigned in node order (like torchrun, nproc may
//                            differ between nodes)
//   attempt_<n>/done_<k>     all of node k's workers exited 0 in attempt n
//   attempt_<n>/failed       counter: nodes that saw a worker fail in attempt n; the first one
//                            writes attempt_<n>/failure ("rank= node= local_rank= pid= code= signal=")
//   shutdown                 a node got SIGINT/SIGTERM/SIGHUP ("<signal> <node>"): all nodes stop
//   end                      counter of nodes that finished; node 0 (the store's host) waits for
//                            all of them before it exits, so nobody loses the store mid-read
// Every node polls these keys each --monitor-interval. Attempt n succeeds when every node wrote
// done_<k>; it fails when anybody bumped `failed`: then every node stops its workers (SIGTERM,
// --grace-period, SIGKILL) and, while restarts are left, all nodes meet again for attempt n+1.
// The store's server speaks both dialects of the protocol, so workers on LibTorch 1.13 and 2.x
// (C++ or Python) connect to it alike.
#include "launch/launcher/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "common/errors.h"
#include "common/files.h"
#include "common/log.h"
#include "common/process.h"
#include "launch/launcher/store.h"
#include "launch/launcher/workers.h"

namespace lm::launch {
namespace {

namespace fs = std::filesystem;
using Clock = clock::Steady;

constexpr int kLogTailLines = 10;

using clock::seconds_since;

std::string first_line(std::string msg) {
  if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
  return msg;
}

// Throws UsageError when something already listens on `port` (checked before the store binds it,
// for the one line users know).
void check_port_free(int port) {
  for (int family : {AF_INET6, AF_INET}) {
    int s = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) continue;
    int one = 1;
    ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (family == AF_INET6) {
      sockaddr_in6 a{};
      a.sin6_family = AF_INET6;
      a.sin6_addr = in6addr_any;
      a.sin6_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    } else {
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_ANY);
      a.sin_port = htons(static_cast<uint16_t>(port));
      rc = ::bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a);
    }
    int err = errno;
    ::close(s);
    if (rc != 0 && err == EADDRINUSE)
      throw UsageError(strf("--master-port %d is already in use on this node (node 0 hosts the store there)", port));
    if (rc != 0 && err == EACCES)
      throw UsageError(strf("--master-port %d: permission denied (privileged port)", port));
    if (rc == 0) return;
  }
}

// ---- signals: a self-pipe read by the event loop ----------------------------------------------

int g_sig_pipe[2] = {-1, -1};

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_sig_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

void install(int sig, void (*handler)(int)) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(sig, &sa, nullptr);
}

constexpr int kForwardedSignals[] = {SIGINT, SIGTERM, SIGHUP};

// How an attempt ended.
struct Outcome {
  enum Kind { kSuccess, kFailed, kInterrupted } kind = kSuccess;
  Failure failure;       // kFailed
  int signal = 0;        // kInterrupted
  int signal_node = -1;  // kInterrupted: the node that got it
};

class Launcher {
 public:
  explicit Launcher(const Options& o)
      : o_(o), prefix_("launch/" + o_.run_id + "/"), workers_(o_, g_sig_pipe[0], [this] { read_signals(); }) {}
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int run() {
    connect_store();
    for (int sig : kForwardedSignals) install(sig, on_signal);
    log::info(strf("[launch] node %d/%d, run id %s, store %s:%d, logs in %s/%s/attempt_<n>/rank_<r>.log",
                   o_.node_rank, o_.nnodes, o_.run_id.c_str(), o_.master_addr.c_str(), port_,
                   o_.log_dir.c_str(), o_.run_id.c_str()));
    for (int attempt = 0;; ++attempt) {
      Outcome out = rendezvous(attempt);
      if (out.kind == Outcome::kSuccess) out = run_attempt(attempt);
      if (out.kind == Outcome::kFailed && attempt < o_.max_restarts) {
        log::warn(strf("[launch] attempt %d failed: rank %d (node %d) %s; restarting the worker group "
                       "(restart %d of %d)",
                       attempt, out.failure.rank, out.failure.node, out.failure.how().c_str(), attempt + 1,
                       o_.max_restarts));
        continue;
      }
      return finish(attempt, out);
    }
  }

 private:
  // The exit code of the job's last attempt, after the "end" barrier.
  int finish(int attempt, const Outcome& out) {
    int code = kExitOk;
    switch (out.kind) {
      case Outcome::kSuccess:
        log::info(strf("[launch] attempt %d: all workers exited 0", attempt));
        break;
      case Outcome::kInterrupted:
        if (out.signal_node == o_.node_rank)
          log::warn(strf("[launch] %s received: workers stopped", signal_name(out.signal).c_str()));
        else
          log::warn(strf("[launch] node %d received %s: workers stopped", out.signal_node,
                         signal_name(out.signal).c_str()));
        code = 128 + out.signal;
        break;
      case Outcome::kFailed:
        print_summary(attempt, out.failure);
        code = out.failure.code;
        break;
    }
    end_barrier();
    return code;
  }

  // ---- signals and workers ----

  // Drains the self-pipe: SIGCHLD only wakes the loop; the others are queued.
  void read_signals() {
    unsigned char buf[64];
    ssize_t n;
    while ((n = ::read(g_sig_pipe[0], buf, sizeof buf)) > 0)
      for (ssize_t i = 0; i < n; ++i)
        if (buf[i] != SIGCHLD) signals_.push_back(buf[i]);
  }

  void pump(int timeout_ms) { workers_.pump(timeout_ms); }

  // A second signal to the launcher cuts the grace period short.
  void stop_workers(int sig) {
    const size_t signals_before = signals_.size();
    workers_.stop(sig, [&] { return signals_.size() != signals_before; });
  }

  // ---- store ----

  // Node 0 starts the server; every node connects a client (node 0's through MASTER_ADDR, as c10d's
  // own server-side TCPStore does).
  void connect_store() {
    const bool host = o_.node_rank == 0;
    const auto timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.rdzv_timeout_s * 1000));
    if (host && o_.master_port != 0) check_port_free(o_.master_port);
    if (!host)
      log::info(strf("[launch] node %d: connecting to the store at %s:%d (up to %.0f s)", o_.node_rank,
                     o_.master_addr.c_str(), o_.master_port, o_.rdzv_timeout_s));
    try {
      if (host) server_ = std::make_unique<StoreServer>(o_.master_port);
      port_ = host ? server_->port() : o_.master_port;
      store_ = std::make_unique<StoreClient>(o_.master_addr, port_, timeout);
    } catch (const std::exception& e) {
      std::string msg = first_line(e.what());
      if (host)
        throw UsageError(strf("cannot host the rendezvous store on port %d: %s", o_.master_port, msg.c_str()));
      throw Error(strf("cannot reach the rendezvous store at %s:%d: %s", o_.master_addr.c_str(), o_.master_port,
                       msg.c_str()));
    }
  }

  std::string key(int attempt, const std::string& name) const {
    return prefix_ + "attempt_" + std::to_string(attempt) + "/" + name;
  }

  // Runs a store operation; a lost store (node 0 gone) stops the workers and fails the run.
  template <typename F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      std::string msg = first_line(e.what());
      stop_workers(SIGTERM);
      throw Error(strf("lost the rendezvous store at %s:%d (node 0 gone?): %s", o_.master_addr.c_str(), port_,
                       msg.c_str()));
    }
  }

  // The signal and node of a shutdown published by some node, if any.
  std::optional<std::pair<int, int>> shutdown_requested() {
    if (!guarded([&] { return store_->check({prefix_ + "shutdown"}); })) return std::nullopt;
    std::string v = guarded([&] { return store_->get(prefix_ + "shutdown"); });
    int sig = SIGTERM, node = -1;
    std::sscanf(v.c_str(), "%d %d", &sig, &node);
    return std::make_pair(sig, node);
  }

  void publish_shutdown(int sig) {
    try {
      store_->set(prefix_ + "shutdown", strf("%d %d", sig, o_.node_rank));
    } catch (const std::exception&) {
      // the store is gone: nobody to tell
    }
  }

  // Every node counts itself into "end"; node 0 keeps the store up until all did (bounded wait).
  void end_barrier() {
    try {
      store_->add(prefix_ + "end", 1);
      if (o_.node_rank != 0) return;
      auto t0 = Clock::now();
      double limit = std::max(30.0, o_.grace_period_s + 10 * o_.monitor_interval_s + 10);
      while (store_->add(prefix_ + "end", 0) < o_.nnodes && seconds_since(t0) < limit) {
        pump(50);
        if (!signals_.empty()) break;  // interrupted again: leave now
      }
    } catch (const std::exception&) {
    }
  }

  // ---- rendezvous ----

  // Announces this node for `attempt` and waits for all nodes, then reads every node's worker
  // count (node_nproc_). Returns kSuccess when all are there, kInterrupted on a signal here or a
  // shutdown elsewhere; throws on timeout (Error) or nodes that disagree (UsageError).
  Outcome rendezvous(int attempt) {
    std::string info = strf("nproc=%d max_restarts=%d nnodes=%d", o_.nproc_per_node, o_.max_restarts, o_.nnodes);
    guarded([&] { store_->set(key(attempt, "node_" + std::to_string(o_.node_rank)), info); });
    std::vector<std::string> keys;
    for (int k = 0; k < o_.nnodes; ++k) keys.push_back(key(attempt, "node_" + std::to_string(k)));
    auto t0 = Clock::now();
    auto next_poll = Clock::now();
    while (true) {
      if (!signals_.empty()) return interrupted_here();
      if (Clock::now() >= next_poll) {
        if (auto sd = shutdown_requested()) return interrupted_remote(*sd);
        if (guarded([&] { return store_->check(keys); })) break;
        next_poll = Clock::now() + std::chrono::milliseconds(20);
      }
      if (seconds_since(t0) > o_.rdzv_timeout_s) throw rendezvous_timeout(attempt, keys);
      pump(20);
    }
    read_node_nproc(keys);
    return {};
  }

  Error rendezvous_timeout(int attempt, const std::vector<std::string>& keys) {
    std::string missing;
    for (int k = 0; k < o_.nnodes; ++k)
      if (!guarded([&] { return store_->check({keys[k]}); })) missing += (missing.empty() ? "" : ",") + std::to_string(k);
    return Error(strf("attempt %d: timed out after %.0f s waiting for node(s) %s at %s:%d (same --nnodes, "
                      "--master-addr, --master-port and --run-id on every node?)",
                      attempt, o_.rdzv_timeout_s, missing.c_str(), o_.master_addr.c_str(), port_));
  }

  // Every node's worker count from its node_<k> key; throws UsageError when nodes disagree.
  void read_node_nproc(const std::vector<std::string>& keys) {
    node_nproc_.assign(o_.nnodes, 0);
    for (int k = 0; k < o_.nnodes; ++k) {
      std::string v = guarded([&] { return store_->get(keys[k]); });
      int nproc = 0, max_restarts = -1, nnodes = 0;
      std::sscanf(v.c_str(), "nproc=%d max_restarts=%d nnodes=%d", &nproc, &max_restarts, &nnodes);
      if (max_restarts != o_.max_restarts || nnodes != o_.nnodes)
        throw UsageError(strf("node %d runs with --max-restarts %d --nnodes %d, this node with %d and %d: "
                              "every node needs the same values",
                              k, max_restarts, nnodes, o_.max_restarts, o_.nnodes));
      node_nproc_[k] = nproc;
    }
  }

  Outcome interrupted_here() {
    int sig = signals_.front();
    signals_.clear();
    publish_shutdown(sig);
    Outcome out;
    out.kind = Outcome::kInterrupted;
    out.signal = sig;
    out.signal_node = o_.node_rank;
    return out;
  }

  static Outcome interrupted_remote(std::pair<int, int> sd) {
    Outcome out;
    out.kind = Outcome::kInterrupted;
    out.signal = sd.first;
    out.signal_node = sd.second;
    return out;
  }

  // ---- one attempt ----

  Outcome run_attempt(int attempt) {
    int offset = 0, world = 0;
    for (int k = 0; k < o_.nnodes; ++k) {
      if (k < o_.node_rank) offset += node_nproc_[k];
      world += node_nproc_[k];
    }
    workers_.start(attempt, offset, world, port_);
    log::info(strf("[launch] attempt %d: started ranks %d-%d of %d (restart count %d of max %d)", attempt, offset,
                   offset + o_.nproc_per_node - 1, world, attempt, o_.max_restarts));
    return monitor(attempt);
  }

  // Until the attempt ends: a signal here, a failed worker here or elsewhere, a shutdown
  // elsewhere, or every node done.
  Outcome monitor(int attempt) {
    const auto interval = std::chrono::microseconds(static_cast<int64_t>(o_.monitor_interval_s * 1e6));
    auto next_poll = Clock::now() + interval;
    bool done = false;
    while (true) {
      auto now = Clock::now();
      int wait_ms = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(next_poll - now).count());
      pump(std::clamp(wait_ms, 0, 100));

      if (!signals_.empty()) {
        Outcome out = interrupted_here();
        stop_workers(out.signal);
        return out;
      }
      if (workers_.first_failure()) {
        stop_workers(SIGTERM);
        return failed(attempt, &*workers_.first_failure());
      }
      bool poll_now = Clock::now() >= next_poll;
      if (!done && !workers_.any_running()) {
        stop_workers(SIGTERM);  // drains output, sweeps leftover processes of the groups
        done = true;
        guarded([&] { store_->set(key(attempt, "done_" + std::to_string(o_.node_rank)), "1"); });
        if (o_.nnodes > 1)
          log::info(strf("[launch] attempt %d: this node's workers exited 0; waiting for the other nodes", attempt));
        poll_now = true;
      }
      if (!poll_now) continue;
      next_poll = Clock::now() + interval;
      if (guarded([&] { return store_->check({key(attempt, "failed")}); })) {
        stop_workers(SIGTERM);
        return failed(attempt, nullptr);
      }
      if (auto sd = shutdown_requested()) {
        stop_workers(sd->first);
        return interrupted_remote(*sd);
      }
      if (done && all_done(attempt)) return {};
    }
  }

  bool all_done(int attempt) {
    std::vector<std::string> keys;
    for (int k = 0; k < o_.nnodes; ++k) keys.push_back(key(attempt, "done_" + std::to_string(k)));
    return guarded([&] { return store_->check(keys); });
  }

  // Records a failure of `attempt` (`local`: this node's first failed worker, or null when another
  // node reported one) and returns the group's first failure as recorded in the store.
  Outcome failed(int attempt, const Failure* local) {
    Outcome out;
    out.kind = Outcome::kFailed;
    if (local) {
      int64_t n = guarded([&] { return store_->add(key(attempt, "failed"), 1); });
      if (n == 1) {
        guarded([&] { store_->set(key(attempt, "failure"), local->encode()); });
        out.failure = *local;
        return out;
      }
    }
    auto t0 = Clock::now();
    while (!guarded([&] { return store_->check({key(attempt, "failure")}); })) {
      if (seconds_since(t0) > 30) throw Error(strf("attempt %d failed on another node, which did not say how", attempt));
      pump(20);
    }
    out.failure = Failure::decode(guarded([&] { return store_->get(key(attempt, "failure")); }));
    if (local && out.failure.rank == local->rank) out.failure = *local;
    return out;
  }

  void print_summary(int attempt, const Failure& f) {
    std::string s = strf("launch: worker group failed on attempt %d (restarts: %d, --max-restarts %d)\n", attempt,
                         attempt, o_.max_restarts);
    s += strf("launch:   rank %d (node %d, local rank %d, pid %ld) %s\n", f.rank, f.node, f.local_rank, f.pid,
              f.how().c_str());
    if (f.node == o_.node_rank) {
      std::string path = (fs::path(o_.log_dir) / o_.run_id / ("attempt_" + std::to_string(attempt)) /
                          ("rank_" + std::to_string(f.rank) + ".log"))
                             .string();
      auto lines = files::tail_lines(path, kLogTailLines);
      s += strf("launch:   last %zu line(s) of %s:\n", lines.size(), path.c_str());
      for (auto& l : lines) s += "launch:     | " + l + "\n";
    } else {
      s += strf("launch:   its log is rank_%d.log under attempt_%d on node %d\n", f.rank, attempt, f.node);
    }
    std::fflush(stdout);
    write_all(2, s);
  }

  const Options& o_;
  const std::string prefix_;  // "launch/<run_id>/"
  std::unique_ptr<StoreServer> server_;  // node 0 only
  std::unique_ptr<StoreClient> store_;
  int port_ = 0;                 // the store's port (the chosen one with --standalone)
  std::vector<int> node_nproc_;  // workers per node, from the rendezvous
  std::vector<int> signals_;     // SIGINT/SIGTERM/SIGHUP received, oldest first
  WorkerGroup workers_;
};

}  // namespace

int run_launcher(const Options& o) {
  if (::pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("pipe2 failed");
  install(SIGCHLD, on_signal);  // wakes the event loop when a worker exits
  ::signal(SIGPIPE, SIG_IGN);
  Launcher l(o);
  return l.run();
}

}  // namespace lm::launch
