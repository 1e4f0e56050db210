// The launcher of one node: rendezvous with the other nodes' launchers over node 0's store (a
// c10d TCPStore to the workers, store.h), attempts of the worker group (workers.h), restarts on
// failure, signal forwarding, and the exit code. The store's keys are described in launcher.cpp,
// the exit codes in main.cpp.
#pragma once

#include "launch/launcher/options.h"

namespace lm::launch {

// Runs attempts until one succeeds on every node, restarts run out, or a signal stops the job, and
// returns the exit code. Throws UsageError (port in use on node 0, COMMAND not executable, nodes
// that disagree) or Error (rendezvous timeout, lost the store). Call once per process: it installs
// handlers for SIGINT, SIGTERM, SIGHUP, SIGCHLD and ignores SIGPIPE.
int run_launcher(const Options& o);

}  // namespace lm::launch
