// `launch`: a torchrun-style launcher. Starts --nproc-per-node copies of COMMAND on this node with
// the environment torchrun gives its workers, prefixes and keeps their output, forwards signals,
// and restarts the whole worker group (on every node) when a worker fails.
//
//   launch [options] [--] COMMAND [ARGS...]        (`launch --help` lists the options)
//
// Rendezvous (like torchrun's static TCP rendezvous): the launcher of node 0 hosts a
// c10d::TCPStore at MASTER_ADDR:MASTER_PORT; the launchers of the other nodes connect to it as
// clients. Workers get TORCHELASTIC_USE_AGENT_STORE=True and connect to the same store as clients
// under the prefix "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" (the trainer does that part).
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
//
// Logs: every worker's stdout and stderr go to this launcher's stdout and stderr, each line
// prefixed with "[rank<r>]: ", and both (unprefixed) to LOG_DIR/<run_id>/attempt_<n>/rank_<r>.log
// (LOG_DIR default ./launch_logs; a rank's file is truncated when its attempt starts).
// Each worker runs in its own process group (signals reach its children too) with stdin from
// /dev/null, and gets SIGKILL if this launcher dies (PR_SET_PDEATHSIG).
//
// Exit codes: 0 all workers of the final attempt exited 0 on every node. Past --max-restarts: the
// failed worker's exit code, or 128+signal when a signal killed it, with a summary on stderr
// (rank, node, code or signal name, the last 10 lines of its log). 128+signal when a launcher got
// SIGINT/SIGTERM/SIGHUP (on this or another node; forwarded to the workers, SIGKILL after the grace
// period). 2 with one line for bad input (options, command not found, port in use on node 0).
// 1 other runtime failures (rendezvous timeout, lost the store).
//
// LibTorch versions: only TCPStore(host, TCPStoreOptions) with fields that 1.13 and 2.x share is
// used; the NCCL async error handling variable's name comes from trainer/compat.h.
#include <CLI/CLI.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/compat.h"
#include "common/errors.h"
#include "common/log.h"

extern char** environ;

namespace lm::launch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr const char* kNcclAsyncErrorVar = compat::kNcclAsyncErrorHandlingVar;

constexpr int kLogTailLines = 10;

// ---- options ------------------------------------------------------------------------------------

struct Options {
  int nproc_per_node = 1;              // workers on this node
  int nnodes = 1;                      // launchers (nodes) in the job
  int node_rank = 0;                   // this node, 0..nnodes-1; node 0 hosts the store
  std::string master_addr = "127.0.0.1";  // host of node 0's store (and the workers' MASTER_ADDR)
  int master_port = 29500;             // port of node 0's store (and the workers' MASTER_PORT)
  int max_restarts = 0;                // group restarts after a failure before giving up
  std::string log_dir = "launch_logs"; // per-rank logs under LOG_DIR/<run_id>/attempt_<n>/
  bool standalone = false;             // one node, store on a free port of 127.0.0.1
  std::string run_id = "none";         // TORCHELASTIC_RUN_ID; same on every node
  std::string role = "default";        // ROLE_NAME
  double grace_period_s = 10;          // SIGTERM (or the forwarded signal) -> SIGKILL
  double monitor_interval_s = 0.5;     // how often the store is polled for other nodes' news
  double rdzv_timeout_s = 600;         // waiting for the store and for the other nodes
  std::vector<std::string> command;    // COMMAND [ARGS...]
  std::string command_path;            // COMMAND resolved against PATH
};

long parse_int(const std::string& name, const std::string& s, long lo, long hi) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end != '\0' || errno == ERANGE || v < lo || v > hi) {
    std::string range = hi == LONG_MAX ? strf("an integer >= %ld", lo) : strf("an integer in [%ld, %ld]", lo, hi);
    throw UsageError(strf("%s: expected %s, got '%s'", name.c_str(), range.c_str(), s.c_str()));
  }
  return v;
}

// COMMAND as execve() will run it: a path with '/' as given, else the first PATH match.
std::string resolve_command(const std::string& cmd) {
  auto executable = [](const std::string& p) {
    struct stat st;
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (cmd.find('/') != std::string::npos) {
    if (!executable(cmd)) throw UsageError(strf("command '%s' is not an executable file", cmd.c_str()));
    return cmd;
  }
  const char* path = std::getenv("PATH");
  std::stringstream ss(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
  std::string dir;
  while (std::getline(ss, dir, ':')) {
    std::string p = (dir.empty() ? "." : dir) + "/" + cmd;
    if (executable(p)) return p;
  }
  throw UsageError(strf("command '%s' not found in PATH", cmd.c_str()));
}

// Returns nullopt after printing --help.
std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  std::string nproc = "1", nnodes = "1", node_rank = "0", port = "29500", restarts = "0";
  CLI::App app{
      "launch: a torchrun-style launcher. Runs --nproc-per-node copies of COMMAND on this node with\n"
      "torchrun's worker environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
      "GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,\n"
      "TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,\n"
      "TORCHELASTIC_USE_AGENT_STORE=True, OMP_NUM_THREADS=1 when unset and nproc > 1).\n"
      "Command line: launch [OPTIONS] [--] COMMAND [ARGS...]   (every option also takes _ for -)",
      "launch"};
  app.footer(
      "Several nodes: run one launch per node with the same --nnodes, --master-addr, --master-port,\n"
      "--run-id and --max-restarts and its own --node-rank; node 0 hosts the rendezvous store.\n"
      "Worker output: prefixed \"[rank<r>]: \" on stdout/stderr, kept in\n"
      "LOG_DIR/<run_id>/attempt_<n>/rank_<r>.log. A failed worker stops and restarts the group on\n"
      "every node, up to --max-restarts times.\n"
      "Exit: 0 ok; the failed worker's code (128+signal if killed) past --max-restarts; 128+signal\n"
      "when interrupted; 2 bad input (one line); 1 other failures.");
  app.add_option("--nproc-per-node,--nproc_per_node", nproc, "Workers on this node (an integer >= 1)")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--nnodes", nnodes, "Nodes in the job: N (or N:N)")
      ->type_name("INT")->capture_default_str();
  app.add_option("--node-rank,--node_rank", node_rank, "This node's rank, 0..nnodes-1")
      ->type_name("INT")->capture_default_str();
  app.add_option("--master-addr,--master_addr", o.master_addr, "Address of node 0 (hosts the store)")
      ->capture_default_str();
  app.add_option("--master-port,--master_port", port, "Port of the store on node 0")
      ->type_name("INT")->capture_default_str();
  app.add_option("--max-restarts,--max_restarts", restarts, "Worker group restarts before failing")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--log-dir,--log_dir", o.log_dir, "Per-rank logs: LOG_DIR/<run_id>/attempt_<n>/rank_<r>.log")
      ->capture_default_str();
  app.add_flag("--standalone", o.standalone,
               "Single node: the store listens on a free port of 127.0.0.1 (ignores --master-addr/--master-port); "
               "the run id is random unless --run-id is given");
  auto* run_id_opt = app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", o.run_id,
                                    "Job id (TORCHELASTIC_RUN_ID), the same on every node")
                         ->capture_default_str();
  app.add_option("--role", o.role, "ROLE_NAME of the workers")->capture_default_str();
  app.add_option("--grace-period,--grace_period", o.grace_period_s,
                 "Seconds between SIGTERM (or a forwarded signal) and SIGKILL when stopping workers")
      ->capture_default_str();
  app.add_option("--monitor-interval,--monitor_interval", o.monitor_interval_s,
                 "Seconds between polls of the store for other nodes' failures and completion")
      ->capture_default_str();
  app.add_option("--rdzv-timeout,--rdzv_timeout", o.rdzv_timeout_s,
                 "Seconds to wait for the store and for all nodes at each attempt")
      ->capture_default_str();
  bool no_python = false;
  app.add_flag("--no-python,--no_python", no_python, "Accepted for torchrun compatibility (COMMAND always runs as is)");
  app.prefix_command();  // everything from COMMAND (or after --) on belongs to the command
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      app.exit(e);
      return std::nullopt;
    }
    std::string msg = e.what();
    if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
    throw UsageError(msg);
  }
  std::vector<std::string> rest = app.remaining();
  if (!rest.empty() && rest[0] == "--") rest.erase(rest.begin());
  else if (!rest.empty() && rest[0].size() > 1 && rest[0][0] == '-')
    throw UsageError(strf("unknown option '%s' (see --help; put -- before a command starting with -)", rest[0].c_str()));
  if (rest.empty()) throw UsageError("no command given: usage: launch [options] [--] COMMAND [ARGS...]");
  o.command = rest;

  o.nproc_per_node = static_cast<int>(parse_int("--nproc-per-node", nproc, 1, 1 << 16));
  if (auto colon = nnodes.find(':'); colon != std::string::npos) {
    long lo = parse_int("--nnodes", nnodes.substr(0, colon), 1, 1 << 20);
    long hi = parse_int("--nnodes", nnodes.substr(colon + 1), 1, 1 << 20);
    if (lo != hi) throw UsageError(strf("--nnodes: elastic ranges (%s) are not supported; give one number", nnodes.c_str()));
    o.nnodes = static_cast<int>(lo);
  } else {
    o.nnodes = static_cast<int>(parse_int("--nnodes", nnodes, 1, 1 << 20));
  }
  o.node_rank = static_cast<int>(parse_int("--node-rank", node_rank, 0, o.nnodes - 1));
  o.max_restarts = static_cast<int>(parse_int("--max-restarts", restarts, 0, 1 << 20));
  if (o.standalone) {
    if (o.nnodes != 1 || o.node_rank != 0) throw UsageError("--standalone runs one node: drop --nnodes/--node-rank");
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
    if (run_id_opt->count() == 0) {
      std::random_device rd;
      o.run_id = strf("%08x%08x", rd(), rd());
    }
  } else {
    o.master_port = static_cast<int>(parse_int("--master-port", port, 1, 65535));
  }
  if (o.master_addr.empty()) throw UsageError("--master-addr: empty");
  if (o.run_id.empty() || o.run_id.find('/') != std::string::npos || o.run_id == "." || o.run_id == "..")
    throw UsageError(strf("--run-id: '%s' is not usable as a directory name", o.run_id.c_str()));
  if (!(o.grace_period_s >= 0)) throw UsageError("--grace-period: must be >= 0");
  if (!(o.monitor_interval_s > 0)) throw UsageError("--monitor-interval: must be > 0");
  if (!(o.rdzv_timeout_s > 0)) throw UsageError("--rdzv-timeout: must be > 0");
  o.command_path = resolve_command(o.command[0]);
  std::error_code ec;
  fs::create_directories(fs::path(o.log_dir) / o.run_id, ec);
  if (ec) throw UsageError(strf("--log-dir: cannot create %s/%s: %s", o.log_dir.c_str(), o.run_id.c_str(), ec.message().c_str()));
  return o;
}

// ---- small helpers ------------------------------------------------------------------------------

std::string signal_name(int sig) {
  static const std::map<int, const char*> names = {
      {SIGHUP, "SIGHUP"},   {SIGINT, "SIGINT"},     {SIGQUIT, "SIGQUIT"}, {SIGILL, "SIGILL"},
      {SIGTRAP, "SIGTRAP"}, {SIGABRT, "SIGABRT"},   {SIGBUS, "SIGBUS"},   {SIGFPE, "SIGFPE"},
      {SIGKILL, "SIGKILL"}, {SIGUSR1, "SIGUSR1"},   {SIGSEGV, "SIGSEGV"}, {SIGUSR2, "SIGUSR2"},
      {SIGPIPE, "SIGPIPE"}, {SIGALRM, "SIGALRM"},   {SIGTERM, "SIGTERM"}, {SIGCHLD, "SIGCHLD"},
      {SIGCONT, "SIGCONT"}, {SIGSTOP, "SIGSTOP"},   {SIGTSTP, "SIGTSTP"}, {SIGTTIN, "SIGTTIN"},
      {SIGTTOU, "SIGTTOU"}, {SIGURG, "SIGURG"},     {SIGXCPU, "SIGXCPU"}, {SIGXFSZ, "SIGXFSZ"},
      {SIGVTALRM, "SIGVTALRM"}, {SIGPROF, "SIGPROF"}, {SIGWINCH, "SIGWINCH"}, {SIGIO, "SIGIO"},
      {SIGPWR, "SIGPWR"},   {SIGSYS, "SIGSYS"}};
  auto it = names.find(sig);
  return it != names.end() ? it->second : strf("SIG%d", sig);
}

// Exit code of a wait status: the code, or 128+signal.
int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

void write_all(int fd, const char* p, size_t n) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return;  // closed stdout (EPIPE) or full disk: the output is dropped, the run goes on
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string str(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The last `n` lines of a file.
std::vector<std::string> tail_lines(const std::string& path, int n) {
  std::ifstream in(path);
  std::deque<std::string> q;
  std::string line;
  while (std::getline(in, line)) {
    q.push_back(line);
    if (static_cast<int>(q.size()) > n) q.pop_front();
  }
  return {q.begin(), q.end()};
}

// fds 0-2 open, so that pipes and sockets never land on them.
void ensure_std_fds() {
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);
}

// Throws UsageError when something already listens on `port` (checked before c10d tries, whose
// failure would print several log lines).
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

// Sends c10d's own log lines (connection retries, glog banners) to /dev/null while alive.
class QuietStderr {
 public:
  QuietStderr() {
    std::fflush(stderr);
    saved_ = ::dup(2);
    int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (saved_ >= 0 && null >= 0) ::dup2(null, 2);
    if (null >= 0) ::close(null);
  }
  ~QuietStderr() {
    if (saved_ >= 0) {
      ::dup2(saved_, 2);
      ::close(saved_);
    }
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;

 private:
  int saved_ = -1;
};

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

// ---- the launcher -------------------------------------------------------------------------------

// A worker that failed: who, and how.
struct Failure {
  int rank = -1, node = -1, local_rank = -1;
  long pid = -1;
  int code = 1;    // exit code, or 128+signal
  int signal = 0;  // 0 when it exited

  std::string encode() const {
    return strf("rank=%d node=%d local_rank=%d pid=%ld code=%d signal=%d", rank, node, local_rank, pid, code, signal);
  }
  static Failure decode(const std::string& s) {
    Failure f;
    std::sscanf(s.c_str(), "rank=%d node=%d local_rank=%d pid=%ld code=%d signal=%d", &f.rank, &f.node,
                &f.local_rank, &f.pid, &f.code, &f.signal);
    return f;
  }
  std::string how() const {
    return signal ? strf("was killed by %s (exit code %d)", signal_name(signal).c_str(), code)
                  : strf("exited with code %d", code);
  }
};

struct Stream {
  int fd = -1;      // read end of the worker's pipe; -1 after EOF
  int out_fd = 1;   // where prefixed lines go (1 or 2)
  std::string buf;  // an incomplete line
};

struct Worker {
  int local_rank = 0, rank = 0;
  pid_t pid = -1;
  bool running = false;
  Stream out, err;
  int log_fd = -1;
  std::string log_path;
};

// How an attempt ended.
struct Outcome {
  enum Kind { kSuccess, kFailed, kInterrupted } kind = kSuccess;
  Failure failure;       // kFailed
  int signal = 0;        // kInterrupted
  int signal_node = -1;  // kInterrupted: the node that got it
};

class Launcher {
 public:
  explicit Launcher(Options o) : o_(std::move(o)), prefix_("launch/" + o_.run_id + "/") {}
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  int run() {
    if (::pipe2(g_sig_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error("pipe2 failed");
    dev_null_ = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    install(SIGCHLD, on_signal);
    ::signal(SIGPIPE, SIG_IGN);
    connect_store();
    for (int sig : kForwardedSignals) install(sig, on_signal);
    log::info(strf("[launch] node %d/%d, run id %s, store %s:%d, logs in %s/%s/attempt_<n>/rank_<r>.log",
                   o_.node_rank, o_.nnodes, o_.run_id.c_str(), o_.master_addr.c_str(), port_,
                   o_.log_dir.c_str(), o_.run_id.c_str()));

    for (int attempt = 0;; ++attempt) {
      Outcome out = rendezvous(attempt);
      if (out.kind == Outcome::kSuccess) out = run_attempt(attempt);
      switch (out.kind) {
        case Outcome::kSuccess:
          log::info(strf("[launch] attempt %d: all workers exited 0", attempt));
          end_barrier();
          return kExitOk;
        case Outcome::kInterrupted:
          if (out.signal_node == o_.node_rank)
            log::warn(strf("[launch] %s received: workers stopped", signal_name(out.signal).c_str()));
          else
            log::warn(strf("[launch] node %d received %s: workers stopped", out.signal_node,
                           signal_name(out.signal).c_str()));
          end_barrier();
          return 128 + out.signal;
        case Outcome::kFailed:
          if (attempt < o_.max_restarts) {
            log::warn(strf("[launch] attempt %d failed: rank %d (node %d) %s; restarting the worker group "
                           "(restart %d of %d)",
                           attempt, out.failure.rank, out.failure.node, out.failure.how().c_str(), attempt + 1,
                           o_.max_restarts));
            continue;
          }
          print_summary(attempt, out.failure);
          end_barrier();
          return out.failure.code;
      }
    }
  }

 private:
  // ---- store ----

  void connect_store() {
    c10d::TCPStoreOptions so;
    so.isServer = o_.node_rank == 0;
    so.port = static_cast<uint16_t>(o_.master_port);
    so.waitWorkers = false;  // the launchers meet through their own keys (rendezvous())
    so.timeout = std::chrono::milliseconds(static_cast<int64_t>(o_.rdzv_timeout_s * 1000));
    if (so.isServer && o_.master_port != 0) check_port_free(o_.master_port);
    if (!so.isServer)
      log::info(strf("[launch] node %d: connecting to the store at %s:%d (up to %.0f s)", o_.node_rank,
                     o_.master_addr.c_str(), o_.master_port, o_.rdzv_timeout_s));
    try {
      QuietStderr quiet;
      store_ = c10::make_intrusive<c10d::TCPStore>(o_.master_addr, so);
    } catch (const std::exception& e) {
      std::string msg = e.what();
      if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
      if (so.isServer)
        throw UsageError(strf("cannot host the rendezvous store on port %d: %s", o_.master_port, msg.c_str()));
      throw Error(strf("cannot reach the rendezvous store at %s:%d: %s", o_.master_addr.c_str(), o_.master_port,
                       msg.c_str()));
    }
    port_ = store_->getPort();
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
      std::string msg = e.what();
      if (auto nl = msg.find('\n'); nl != std::string::npos) msg.resize(nl);
      stop_workers(SIGTERM);
      throw Error(strf("lost the rendezvous store at %s:%d (node 0 gone?): %s", o_.master_addr.c_str(), port_,
                       msg.c_str()));
    }
  }

  // The signal and node of a shutdown published by some node, if any.
  std::optional<std::pair<int, int>> shutdown_requested() {
    if (!guarded([&] { return store_->check({prefix_ + "shutdown"}); })) return std::nullopt;
    std::string v = str(guarded([&] { return store_->get(prefix_ + "shutdown"); }));
    int sig = SIGTERM, node = -1;
    std::sscanf(v.c_str(), "%d %d", &sig, &node);
    return std::make_pair(sig, node);
  }

  void publish_shutdown(int sig) {
    try {
      store_->set(prefix_ + "shutdown", bytes(strf("%d %d", sig, o_.node_rank)));
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
    guarded([&] { store_->set(key(attempt, "node_" + std::to_string(o_.node_rank)), bytes(info)); });
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
      if (seconds_since(t0) > o_.rdzv_timeout_s) {
        std::string missing;
        for (int k = 0; k < o_.nnodes; ++k)
          if (!guarded([&] { return store_->check({keys[k]}); })) missing += (missing.empty() ? "" : ",") + std::to_string(k);
        throw Error(strf("attempt %d: timed out after %.0f s waiting for node(s) %s at %s:%d (same --nnodes, "
                         "--master-addr, --master-port and --run-id on every node?)",
                         attempt, o_.rdzv_timeout_s, missing.c_str(), o_.master_addr.c_str(), port_));
      }
      pump(20);
    }
    node_nproc_.assign(o_.nnodes, 0);
    for (int k = 0; k < o_.nnodes; ++k) {
      std::string v = str(guarded([&] { return store_->get(keys[k]); }));
      int nproc = 0, max_restarts = -1, nnodes = 0;
      std::sscanf(v.c_str(), "nproc=%d max_restarts=%d nnodes=%d", &nproc, &max_restarts, &nnodes);
      if (max_restarts != o_.max_restarts || nnodes != o_.nnodes)
        throw UsageError(strf("node %d runs with --max-restarts %d --nnodes %d, this node with %d and %d: "
                              "every node needs the same values",
                              k, max_restarts, nnodes, o_.max_restarts, o_.nnodes));
      node_nproc_[k] = nproc;
    }
    return {};
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
    fs::path dir = fs::path(o_.log_dir) / o_.run_id / ("attempt_" + std::to_string(attempt));
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw Error(strf("cannot create %s: %s", dir.c_str(), ec.message().c_str()));

    workers_.assign(o_.nproc_per_node, Worker{});
    first_failure_.reset();
    for (int i = 0; i < o_.nproc_per_node; ++i) {
      Worker& w = workers_[i];
      w.local_rank = i;
      w.rank = offset + i;
      w.log_path = (dir / ("rank_" + std::to_string(w.rank) + ".log")).string();
      w.log_fd = ::open(w.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (w.log_fd < 0) throw Error(strf("cannot write %s: %s", w.log_path.c_str(), std::strerror(errno)));
    }
    for (Worker& w : workers_) {
      spawn(w, worker_env(w, attempt, world));
      if (!exec_error_.empty()) {
        stop_workers(SIGKILL);
        throw UsageError(exec_error_);
      }
    }
    log::info(strf("[launch] attempt %d: started ranks %d-%d of %d (restart count %d of max %d)", attempt, offset,
                   offset + o_.nproc_per_node - 1, world, attempt, o_.max_restarts));

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
      if (first_failure_) {
        stop_workers(SIGTERM);
        return failed(attempt, &*first_failure_);
      }
      bool poll_now = Clock::now() >= next_poll;
      if (!done && std::none_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; })) {
        stop_workers(SIGTERM);  // drains output, sweeps leftover processes of the groups
        done = true;
        guarded([&] { store_->set(key(attempt, "done_" + std::to_string(o_.node_rank)), bytes("1")); });
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
      if (done) {
        std::vector<std::string> keys;
        for (int k = 0; k < o_.nnodes; ++k) keys.push_back(key(attempt, "done_" + std::to_string(k)));
        if (guarded([&] { return store_->check(keys); })) return {};
      }
    }
  }

  // Records a failure of `attempt` (`local`: this node's first failed worker, or null when another
  // node reported one) and returns the group's first failure as recorded in the store.
  Outcome failed(int attempt, const Failure* local) {
    Outcome out;
    out.kind = Outcome::kFailed;
    if (local) {
      int64_t n = guarded([&] { return store_->add(key(attempt, "failed"), 1); });
      if (n == 1) {
        guarded([&] { store_->set(key(attempt, "failure"), bytes(local->encode())); });
        out.failure = *local;
        return out;
      }
    }
    auto t0 = Clock::now();
    while (!guarded([&] { return store_->check({key(attempt, "failure")}); })) {
      if (seconds_since(t0) > 30) throw Error(strf("attempt %d failed on another node, which did not say how", attempt));
      pump(20);
    }
    out.failure = Failure::decode(str(guarded([&] { return store_->get(key(attempt, "failure")); })));
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
      auto lines = tail_lines(path, kLogTailLines);
      s += strf("launch:   last %zu line(s) of %s:\n", lines.size(), path.c_str());
      for (auto& l : lines) s += "launch:     | " + l + "\n";
    } else {
      s += strf("launch:   its log is rank_%d.log under attempt_%d on node %d\n", f.rank, attempt, f.node);
    }
    std::fflush(stdout);
    write_all(2, s.data(), s.size());
  }

  // ---- workers ----

  std::vector<std::string> worker_env(const Worker& w, int attempt, int world) const {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    env["RANK"] = std::to_string(w.rank);
    env["LOCAL_RANK"] = std::to_string(w.local_rank);
    env["WORLD_SIZE"] = std::to_string(world);
    env["LOCAL_WORLD_SIZE"] = std::to_string(o_.nproc_per_node);
    env["GROUP_RANK"] = std::to_string(o_.node_rank);
    env["GROUP_WORLD_SIZE"] = std::to_string(o_.nnodes);
    env["ROLE_RANK"] = std::to_string(w.rank);  // one role: role ranks are the global ranks
    env["ROLE_WORLD_SIZE"] = std::to_string(world);
    env["ROLE_NAME"] = o_.role;
    env["MASTER_ADDR"] = o_.master_addr;
    env["MASTER_PORT"] = std::to_string(port_);
    env["TORCHELASTIC_RESTART_COUNT"] = std::to_string(attempt);
    env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(o_.max_restarts);
    env["TORCHELASTIC_RUN_ID"] = o_.run_id;
    env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
    if (!env.count(kNcclAsyncErrorVar)) env[kNcclAsyncErrorVar] = "1";
    if (!env.count("OMP_NUM_THREADS") && o_.nproc_per_node > 1) env["OMP_NUM_THREADS"] = "1";
    std::vector<std::string> out;
    for (auto& [k, v] : env) out.push_back(k + "=" + v);
    return out;
  }

  // fork + execve with the worker in its own process group (so signals reach its children too),
  // stdin from /dev/null, stdout/stderr into pipes, killed if this launcher dies.
  void spawn(Worker& w, const std::vector<std::string>& env) {
    int out[2], err[2], ex[2];
    if (::pipe2(out, O_CLOEXEC) || ::pipe2(err, O_CLOEXEC) || ::pipe2(ex, O_CLOEXEC))
      throw Error(strf("pipe2: %s", std::strerror(errno)));
    std::vector<char*> argv, envp;
    for (auto& a : o_.command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
    envp.push_back(nullptr);
    const char* path = o_.command_path.c_str();
    pid_t parent = ::getpid();
    rlimit rl{};
    int max_fd = ::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
                     ? static_cast<int>(std::min<rlim_t>(rl.rlim_cur, 1 << 20))
                     : 65536;

    pid_t pid = ::fork();
    if (pid < 0) throw Error(strf("fork: %s", std::strerror(errno)));
    if (pid == 0) {
      // Child: async-signal-safe calls only (the parent has c10d threads).
      ::setpgid(0, 0);
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      ::dup2(dev_null_, 0);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::dup2(ex[1], 3);
      ::fcntl(3, F_SETFD, FD_CLOEXEC);
      if (::syscall(SYS_close_range, 4, ~0U, 0) != 0)
        for (int fd = 4; fd < max_fd; ++fd) ::close(fd);
      ::execve(path, argv.data(), envp.data());
      int e = errno;
      ssize_t ignored = ::write(3, &e, sizeof e);
      (void)ignored;
      ::_exit(127);
    }
    ::setpgid(pid, pid);  // also here, so kill(-pid) works before the child ran
    ::close(out[1]);
    ::close(err[1]);
    ::close(ex[1]);
    int e = 0;
    ssize_t n;
    do n = ::read(ex[0], &e, sizeof e);
    while (n < 0 && errno == EINTR);
    ::close(ex[0]);
    w.pid = pid;
    w.running = true;
    w.out = Stream{out[0], 1, {}};
    w.err = Stream{err[0], 2, {}};
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
    if (n == static_cast<ssize_t>(sizeof e))
      exec_error_ = strf("cannot execute '%s': %s", o_.command_path.c_str(), std::strerror(e));
  }

  // One round of the event loop: waits up to `timeout_ms` for worker output or a signal, copies
  // output, reaps exited workers (noting the first failure unless stopping_), queues signals.
  void pump(int timeout_ms) {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    fds.push_back({g_sig_pipe[0], POLLIN, 0});
    streams.push_back(nullptr);
    for (Worker& w : workers_)
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          fds.push_back({s->fd, POLLIN, 0});
          streams.push_back(s);
        }
    int rc = ::poll(fds.data(), fds.size(), timeout_ms);
    if (rc < 0 && errno != EINTR) throw Error(strf("poll: %s", std::strerror(errno)));
    if (rc > 0) {
      if (fds[0].revents) {
        unsigned char buf[64];
        ssize_t n;
        while ((n = ::read(g_sig_pipe[0], buf, sizeof buf)) > 0)
          for (ssize_t i = 0; i < n; ++i)
            if (buf[i] != SIGCHLD) signals_.push_back(buf[i]);
      }
      for (size_t i = 1; i < fds.size(); ++i)
        if (fds[i].revents) read_stream(*streams[i]);
    }
    reap();
  }

  void reap() {
    int status;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (Worker& w : workers_) {
        if (w.pid != pid || !w.running) continue;
        w.running = false;
        if (status != 0 && !stopping_ && !first_failure_) {
          Failure f;
          f.rank = w.rank;
          f.node = o_.node_rank;
          f.local_rank = w.local_rank;
          f.pid = pid;
          f.code = exit_code_of(status);
          f.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
          first_failure_ = f;
        }
      }
    }
  }

  Worker& owner(const Stream& s) {
    for (Worker& w : workers_)
      if (&w.out == &s || &w.err == &s) return w;
    throw Error("stream without worker");
  }

  void emit_line(Worker& w, Stream& s, const std::string& line) {
    std::string prefixed = "[rank" + std::to_string(w.rank) + "]: " + line + "\n";
    write_all(s.out_fd, prefixed.data(), prefixed.size());
    if (w.log_fd >= 0) {
      std::string l = line + "\n";
      write_all(w.log_fd, l.data(), l.size());
    }
  }

  // Reads what is there; complete lines go out, a partial one waits (flushed at EOF or 64 KiB).
  void read_stream(Stream& s) {
    Worker& w = owner(s);
    char buf[65536];
    while (s.fd >= 0) {
      ssize_t n = ::read(s.fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return;  // EAGAIN: nothing more for now
      if (n == 0) {
        if (!s.buf.empty()) emit_line(w, s, s.buf);
        s.buf.clear();
        ::close(s.fd);
        s.fd = -1;
        return;
      }
      s.buf.append(buf, static_cast<size_t>(n));
      size_t start = 0, nl;
      while ((nl = s.buf.find('\n', start)) != std::string::npos) {
        emit_line(w, s, s.buf.substr(start, nl - start));
        start = nl + 1;
      }
      s.buf.erase(0, start);
      if (s.buf.size() >= 65536) {
        emit_line(w, s, s.buf);
        s.buf.clear();
      }
    }
  }

  // Stops this node's workers: `sig` to each worker's process group, up to --grace-period for
  // them to exit (a second signal to the launcher cuts it short), then SIGKILL; also sweeps what
  // is left of the groups, drains the output and closes the logs. Idempotent.
  void stop_workers(int sig) {
    stopping_ = true;
    bool any = false;
    for (Worker& w : workers_)
      if (w.running) {
        ::kill(-w.pid, sig);
        any = true;
      }
    if (any) {
      size_t signals_before = signals_.size();
      auto t0 = Clock::now();
      while (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; }) &&
             seconds_since(t0) < o_.grace_period_s && signals_.size() == signals_before)
        pump(20);
    }
    for (Worker& w : workers_)
      if (w.pid > 0) ::kill(-w.pid, SIGKILL);  // the group: the worker if still alive, and its leftovers
    while (std::any_of(workers_.begin(), workers_.end(), [](const Worker& w) { return w.running; })) pump(20);
    // Output still in the pipes (writers are dead, or leftovers that SIGKILL is taking down).
    auto t0 = Clock::now();
    auto open_streams = [&] {
      for (Worker& w : workers_)
        if (w.out.fd >= 0 || w.err.fd >= 0) return true;
      return false;
    };
    while (open_streams() && seconds_since(t0) < 1.0) pump(20);
    for (Worker& w : workers_) {
      for (Stream* s : {&w.out, &w.err})
        if (s->fd >= 0) {
          if (!s->buf.empty()) emit_line(w, *s, s->buf);
          ::close(s->fd);
          s->fd = -1;
        }
      if (w.log_fd >= 0) ::close(w.log_fd);
      w.log_fd = -1;
      w.pid = -1;
    }
    stopping_ = false;
  }

  Options o_;
  std::string prefix_;  // "launch/<run_id>/"
  c10::intrusive_ptr<c10d::TCPStore> store_;
  int port_ = 0;                 // the store's port (the chosen one with --standalone)
  int dev_null_ = -1;
  std::vector<int> node_nproc_;  // workers per node, from the rendezvous
  std::vector<Worker> workers_;
  std::optional<Failure> first_failure_;
  std::vector<int> signals_;     // SIGINT/SIGTERM/SIGHUP received, oldest first
  bool stopping_ = false;
  std::string exec_error_;
};

}  // namespace
}  // namespace lm::launch

int main(int argc, char** argv) {
  lm::launch::ensure_std_fds();
  return lm::run_main("launch", [&] {
    auto o = lm::launch::parse_options(argc, argv);
    if (!o) return 0;
    lm::launch::Launcher l(std::move(*o));
    return l.run();
  });
}
