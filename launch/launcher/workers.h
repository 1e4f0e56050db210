// This node's worker group for one attempt: starts --nproc-per-node copies of COMMAND with
// torchrun's worker environment, copies their output (each line prefixed "[rank<r>]: " on this
// launcher's stdout/stderr, and unprefixed to LOG_DIR/<run_id>/attempt_<n>/rank_<r>.log), notes
// the first worker that fails, and stops the group (signal, grace period, SIGKILL).
//
// Each worker runs in its own process group (signals reach its children too) with stdin from
// /dev/null, and gets SIGKILL if this launcher dies. Single-threaded: everything happens in pump().
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/process.h"
#include "launch/launcher/options.h"

namespace lm::launch {

// A worker that failed: who, and how. Travels between nodes as text (encode/decode).
// rank -1: node `node`'s launcher was lost, not a worker.
struct Failure {
  int rank = -1, node = -1, local_rank = -1;
  long pid = -1;
  int code = 1;    // exit code, or 128+signal
  int signal = 0;  // 0 when it exited

  std::string encode() const;  // "rank= node= local_rank= pid= code= signal="
  static Failure decode(const std::string& s);
  std::string how() const;     // "exited with code 3", "was killed by SIGKILL (exit code 137)"
};

// Writes all of `s` to `fd`; on error (closed stdout, full disk) the output is dropped, the run goes on.
void write_all(int fd, const std::string& s);

class WorkerGroup {
 public:
  // `wake_fd`: also watched by pump(); `on_wake` is called when it is readable (it must drain it).
  WorkerGroup(const Options& o, int wake_fd, std::function<void()> on_wake);
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Starts this node's workers of `attempt`: global ranks offset..offset+nproc-1 of `world`, their
  // rank 0's store at master_addr:`port`. Truncates their logs. Throws UsageError when COMMAND cannot be
  // executed (after stopping what started), Error when a log cannot be written.
  void start(int attempt, int offset, int world, int port);

  // One round of the event loop: waits up to `timeout_ms` for worker output or the wake fd, copies
  // output, reaps exited workers (noting the first failure, unless stopping).
  void pump(int timeout_ms);

  // Stops the workers: `sig` to each worker's process group, up to --grace-period for them to
  // exit (cut short when `cut_short()` turns true), then SIGKILL; also kills what is left of the
  // groups, drains the output and closes the logs. Idempotent.
  void stop(int sig, const std::function<bool()>& cut_short);

  bool any_running() const;
  // The first worker of this attempt that exited non-zero (or was killed), if any.
  const std::optional<Failure>& first_failure() const { return first_failure_; }

 private:
  struct Stream {
    int fd = -1;      // read end of the worker's pipe; -1 after EOF
    int out_fd = 1;   // where prefixed lines go (1 or 2)
    std::string buf;  // an incomplete line
  };
  struct Worker {
    int local_rank = 0, rank = 0;
    Process proc;
    bool running = false;
    Stream out, err;
    int log_fd = -1;
  };

  SpawnOptions spawn_options(const Worker& w, int attempt, int world, int port) const;
  void spawn(Worker& w, int attempt, int world, int port);
  void reap();
  void read_stream(Worker& w, Stream& s);
  void emit_line(Worker& w, Stream& s, const std::string& line);
  void close_all();

  const Options& o_;
  const int wake_fd_;
  std::function<void()> on_wake_;
  std::vector<Worker> workers_;
  std::optional<Failure> first_failure_;
  bool stopping_ = false;
};

}  // namespace lm::launch
