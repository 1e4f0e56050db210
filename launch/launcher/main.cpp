// `launch`: a torchrun-style launcher. Starts --nproc-per-node copies of COMMAND on this node with
// the environment torchrun gives its workers, prefixes and keeps their output, forwards signals,
// and restarts the whole worker group (on every node) when a worker fails.
//
//   launch [options] [--] COMMAND [ARGS...]        (`launch --help` lists the options)
//
// Files: options.h (command line), launcher.h (attempts, restarts, signals), rendezvous.h (the
// launchers' own protocol, served by node 0's launch), workers.h (this node's workers: environment,
// output, stopping). The workers' c10d store is theirs: rank 0 hosts it at MASTER_ADDR:MASTER_PORT.
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
// 1 other runtime failures (rendezvous timeout, lost node 0).
#include <fcntl.h>

#include <string>

#include "common/dir_lock.h"
#include "common/errors.h"
#include "launch/launcher/launcher.h"
#include "launch/launcher/options.h"

namespace {

// fds 0-2 open, so that pipes and sockets never land on them.
void ensure_std_fds() {
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0) ::open("/dev/null", O_RDWR);
}

}  // namespace

int main(int argc, char** argv) {
  ensure_std_fds();
  return lm::run_main("launch", [&] {
    auto o = lm::launch::parse_options(argc, argv);
    if (!o) return 0;
    // One launcher per node of a job: a second one would mix its attempts' logs into ours.
    lm::DirLock lock(o->log_dir + "/" + o->run_id, "launch_node" + std::to_string(o->node_rank) + ".lock",
                     "another launch");
    return lm::launch::run_launcher(*o);
  });
}
