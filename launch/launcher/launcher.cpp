// The launcher of one node (see launcher.h).
//
// Each attempt: JOIN the launchers' rendezvous (rendezvous.h; node 0 serves it, or keeps it
// in-process when it is the only node) until every node is there, start this node's workers with
// global ranks in node order (nproc may differ between nodes, as with torchrun) and the MASTER_PORT
// node 0 gave, then POLL each --monitor-interval. The attempt succeeds when every node reported
// DONE; it fails when any node reported FAIL or lost its connection: every node stops its workers
// (SIGTERM, --grace-period, SIGKILL) and, while restarts are left, all meet again for the next
// attempt. A STOP (SIGINT/SIGTERM/SIGHUP on some node) stops every node; node 0 stays up until
// every node said END (bounded), so nobody loses node 0 mid-poll. No launcher touches the workers'
// c10d store: their rank 0 hosts it.
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
#include "launch/launcher/rendezvous.h"
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

// Throws UsageError when something already listens on `port` (checked before anything binds it,
// for the one line users know). `option` and `what` name the port in the message.
void check_port_free(int port, const char* option, const char* what) {
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
      throw UsageError(strf("%s %d is already in use on this node (%s)", option, port, what));
    if (rc != 0 && err == EACCES) throw UsageError(strf("%s %d: permission denied (privileged port)", option, port));
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
  explicit Launcher(const Options& o) : o_(o), workers_(o_, g_sig_pipe[0], [this] { read_signals(); }) {}
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int run() {
    connect();
    for (int sig : kForwardedSignals) install(sig, on_signal);
    log::info(strf("[launch] node %d/%d, run id %s, %s, logs in %s/%s/attempt_<n>/rank_<r>.log", o_.node_rank,
                   o_.nnodes, o_.run_id.c_str(),
                   o_.nnodes > 1 ? strf("rendezvous %s:%d", o_.rdzv_host.c_str(), o_.rdzv_port).c_str()
                                 : "one node",
                   o_.log_dir.c_str(), o_.run_id.c_str()));
    for (int attempt = 0;; ++attempt) {
      Outcome out = rendezvous(attempt);
      if (out.kind == Outcome::kSuccess) out = run_attempt(attempt);
      if (out.kind == Outcome::kFailed && attempt < o_.max_restarts) {
        log::warn(strf("[launch] attempt %d failed: %s %s; restarting the worker group (restart %d of %d)", attempt,
                       who(out.failure).c_str(), out.failure.how().c_str(), attempt + 1, o_.max_restarts));
        continue;
      }
      return finish(attempt, out);
    }
  }

 private:
  static std::string who(const Failure& f) {
    return f.rank >= 0 ? strf("rank %d (node %d)", f.rank, f.node) : strf("node %d", f.node);
  }

  // The exit code of the job's last attempt, after the END barrier.
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

  // ---- the rendezvous ----

  // Node 0 keeps the job's state (and serves it to the other nodes when there are any); every other
  // node connects to it. Then HELLO: node 0 refuses a node whose options disagree (UsageError).
  void connect() {
    const bool host = o_.node_rank == 0;
    if (o_.nnodes == 1) {
      // The workers' store will listen on --master-port: say now when something else does.
      if (!o_.standalone) check_port_free(o_.master_port, "--master-port", "the workers' rank 0 hosts the c10d store there");
      coord_ = std::make_unique<Coordinator>(o_, o_.standalone ? 0 : o_.master_port);
      peer_ = std::make_unique<Peer>(o_, *coord_);
    } else if (host) {
      const char* option = o_.rdzv_from_endpoint ? "--rdzv-endpoint port" : "--master-port";
      check_port_free(o_.rdzv_port, option, "node 0's launch serves the rendezvous there");
      coord_ = std::make_unique<Coordinator>(o_, 0);
      try {
        server_ = std::make_unique<CoordServer>(*coord_, o_.rdzv_port);
      } catch (const std::exception& e) {
        throw UsageError(strf("cannot serve the rendezvous on port %d: %s", o_.rdzv_port, first_line(e.what()).c_str()));
      }
      peer_ = std::make_unique<Peer>(o_, *coord_);
    } else {
      log::info(strf("[launch] node %d: connecting to node 0 at %s:%d (up to %.0f s)", o_.node_rank,
                     o_.rdzv_host.c_str(), o_.rdzv_port, o_.rdzv_timeout_s));
      const auto ms = [](double s) { return std::chrono::milliseconds(static_cast<int64_t>(s * 1000)); };
      try {
        peer_ = std::make_unique<Peer>(o_, o_.rdzv_host, o_.rdzv_port, ms(o_.rdzv_timeout_s),
                                       ms(std::clamp(o_.rdzv_timeout_s, 10.0, 60.0)));
      } catch (const std::exception& e) {
        throw Error(strf("cannot reach node 0's launch at %s:%d: %s", o_.rdzv_host.c_str(), o_.rdzv_port,
                         first_line(e.what()).c_str()));
      }
    }
    peer_->hello();
  }

  // Runs a rendezvous call; a lost node 0 stops the workers and fails the run.
  template <typename F>
  auto guarded(F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const std::exception& e) {
      std::string msg = first_line(e.what());
      stop_workers(SIGTERM);
      throw Error(strf("lost the rendezvous with node 0 at %s:%d (node 0 gone?): %s", o_.rdzv_host.c_str(),
                       o_.rdzv_port, msg.c_str()));
    }
  }

  void publish_shutdown(int sig) {
    try {
      peer_->stop(sig);
    } catch (const std::exception&) {
      // node 0 is gone: nobody to tell
    }
  }

  // Every node says END; node 0 keeps serving until all did (or disconnected; bounded wait).
  void end_barrier() {
    try {
      peer_->end();
      if (o_.node_rank != 0) return;
      auto t0 = Clock::now();
      double limit = std::max(30.0, o_.grace_period_s + 10 * o_.monitor_interval_s + 10);
      while (peer_->ended() < o_.nnodes && seconds_since(t0) < limit) {
        pump(50);
        if (!signals_.empty()) break;  // interrupted again: leave now
      }
    } catch (const std::exception&) {
    }
  }

  // JOINs `attempt` until every node did (node_nproc_, port_). Returns kSuccess then, kInterrupted
  // on a signal here or a STOP elsewhere; throws Error on timeout, naming the missing nodes.
  Outcome rendezvous(int attempt) {
    auto t0 = Clock::now();
    while (true) {
      if (!signals_.empty()) return interrupted_here();
      Poll p = guarded([&] { return peer_->join(attempt, o_.nproc_per_node); });
      if (p.kind == Poll::kStopped) return interrupted_remote(p);
      if (p.kind == Poll::kGo) {
        node_nproc_ = p.node_nproc;
        port_ = p.port;
        return {};
      }
      if (seconds_since(t0) > o_.rdzv_timeout_s) {
        std::string missing;
        for (int k : p.missing) missing += (missing.empty() ? "" : ",") + std::to_string(k);
        throw Error(strf("attempt %d: timed out after %.0f s waiting for node(s) %s at %s:%d (same --nnodes, "
                         "--master-addr, --master-port and --run-id on every node?)",
                         attempt, o_.rdzv_timeout_s, missing.c_str(), o_.rdzv_host.c_str(), o_.rdzv_port));
      }
      pump(20);
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

  static Outcome interrupted_remote(const Poll& p) {
    Outcome out;
    out.kind = Outcome::kInterrupted;
    out.signal = p.signal;
    out.signal_node = p.node;
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
    log::info(strf("[launch] attempt %d: started ranks %d-%d of %d, MASTER_PORT %d (restart count %d of max %d)",
                   attempt, offset, offset + o_.nproc_per_node - 1, world, port_, attempt, o_.max_restarts));
    return monitor(attempt);
  }

  // Until the attempt ends: a signal here, a failed worker here or elsewhere, a STOP elsewhere, or
  // every node done.
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
        const Failure local = *workers_.first_failure();
        stop_workers(SIGTERM);
        Failure first = guarded([&] { return peer_->fail(attempt, local); });
        return failed(first.rank == local.rank && first.node == local.node ? local : first);
      }
      bool poll_now = Clock::now() >= next_poll;
      if (!done && !workers_.any_running()) {
        stop_workers(SIGTERM);  // drains output, sweeps leftover processes of the groups
        done = true;
        guarded([&] { peer_->done(attempt); });
        if (o_.nnodes > 1)
          log::info(strf("[launch] attempt %d: this node's workers exited 0; waiting for the other nodes", attempt));
        poll_now = true;
      }
      if (!poll_now) continue;
      next_poll = Clock::now() + interval;
      Poll p = guarded([&] { return peer_->poll(attempt); });
      if (p.kind == Poll::kFailed) {
        stop_workers(SIGTERM);
        return failed(p.failure);
      }
      if (p.kind == Poll::kStopped) {
        stop_workers(p.signal);
        return interrupted_remote(p);
      }
      if (p.kind == Poll::kDone) return {};
    }
  }

  static Outcome failed(const Failure& f) {
    Outcome out;
    out.kind = Outcome::kFailed;
    out.failure = f;
    return out;
  }

  void print_summary(int attempt, const Failure& f) {
    std::string s = strf("launch: worker group failed on attempt %d (restarts: %d, --max-restarts %d)\n", attempt,
                         attempt, o_.max_restarts);
    if (f.rank < 0) {
      s += strf("launch:   node %d's launch disconnected\n", f.node);
    } else {
      s += strf("launch:   rank %d (node %d, local rank %d, pid %ld) %s\n", f.rank, f.node, f.local_rank, f.pid,
                f.how().c_str());
    }
    if (f.rank >= 0 && f.node == o_.node_rank) {
      std::string path = (fs::path(o_.log_dir) / o_.run_id / ("attempt_" + std::to_string(attempt)) /
                          ("rank_" + std::to_string(f.rank) + ".log"))
                             .string();
      auto lines = files::tail_lines(path, kLogTailLines);
      s += strf("launch:   last %zu line(s) of %s:\n", lines.size(), path.c_str());
      for (auto& l : lines) s += "launch:     | " + l + "\n";
    } else if (f.rank >= 0) {
      s += strf("launch:   its log is rank_%d.log under attempt_%d on node %d\n", f.rank, attempt, f.node);
    }
    std::fflush(stdout);
    write_all(2, s);
  }

  const Options& o_;
  std::unique_ptr<Coordinator> coord_;  // node 0 only
  std::unique_ptr<CoordServer> server_;  // node 0 of several
  std::unique_ptr<Peer> peer_;
  int port_ = 0;                 // the workers' MASTER_PORT of the current attempt
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
