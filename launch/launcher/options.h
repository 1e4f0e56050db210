// launch's command line: `launch [OPTIONS] [--] COMMAND [ARGS...]` (torchrun's option names, each
// also spelled with '_' for '-'). `launch --help` prints the full list.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace lm::launch {

struct Options {
  int nproc_per_node = 1;                 // workers on this node
  int nnodes = 1;                         // launchers (nodes) in the job
  int node_rank = 0;                      // this node, 0..nnodes-1; node 0 serves the rendezvous
  std::string master_addr = "127.0.0.1";  // node 0's host: the workers' MASTER_ADDR
  int master_port = 29500;                // one node: the workers' MASTER_PORT (0 with --standalone: a free one
                                          // per attempt); several: the rendezvous port unless --rdzv-endpoint
  int max_restarts = 0;                   // group restarts after a failure before giving up
  std::string log_dir = "launch_logs";    // per-rank logs under LOG_DIR/<run_id>/attempt_<n>/
  bool standalone = false;                // one node, workers' store on a free port of 127.0.0.1
  std::string run_id = "none";            // TORCHELASTIC_RUN_ID; same on every node (random with --standalone)
  std::string role = "default";           // ROLE_NAME
  double grace_period_s = 10;             // SIGTERM (or the forwarded signal) -> SIGKILL
  double monitor_interval_s = 0.5;        // how often node 0 is polled for other nodes' news
  double rdzv_timeout_s = 600;            // waiting for node 0 and for the other nodes
  std::string rdzv_host;                  // where node 0's launch serves the rendezvous (rendezvous.h):
  int rdzv_port = 0;                      //   --rdzv-endpoint HOST:PORT, else MASTER_ADDR:MASTER_PORT
  bool rdzv_from_endpoint = false;        // --rdzv-endpoint given
  std::vector<std::string> command;       // COMMAND [ARGS...]
  std::string command_path;               // COMMAND resolved against PATH
};

// Parses and checks the command line, resolves COMMAND and creates LOG_DIR/<run_id>. Returns
// nullopt after printing --help. Throws UsageError (one line, exit 2) for bad input.
std::optional<Options> parse_options(int argc, char** argv);

}  // namespace lm::launch
