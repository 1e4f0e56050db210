// The launcher of one node: rendezvous with the other nodes' launchers over node 0's launch (the
// launchers' own protocol, rendezvous.h), attempts of the worker group (workers.h), restarts on
// failure, signal forwarding, and the exit code (main.cpp).
#pragma once

#include "launch/launcher/options.h"

namespace lm::launch {

// Runs attempts until one succeeds on every node, restarts run out, or a signal stops the job, and
// returns the exit code. Throws UsageError (port in use on node 0, COMMAND not executable, nodes
// that disagree) or Error (rendezvous timeout, lost node 0). Call once per process: it installs
// handlers for SIGINT, SIGTERM, SIGHUP, SIGCHLD and ignores SIGPIPE.
int run_launcher(const Options& o);

}  // namespace lm::launch
