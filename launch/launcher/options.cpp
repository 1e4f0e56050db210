// launch's command line (see options.h): CLI11 reads the options as text, then each is checked
// here so that every bad value gives one line naming the option.
#include "launch/launcher/options.h"

#include <CLI/CLI.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <sstream>

#include "common/errors.h"
#include "common/log.h"

namespace lm::launch {
namespace {

namespace fs = std::filesystem;

// The numeric options as given, checked after parsing (CLI11's own messages name no range).
struct RawNumbers {
  std::string nproc = "1", nnodes = "1", node_rank = "0", port = "29500", restarts = "0";
  CLI::Option* run_id = nullptr;  // to tell a given --run-id from the default
  CLI::Option* master_addr = nullptr;
  std::string rdzv_endpoint;
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

void describe(CLI::App& app) {
  app.description(
      "launch: a torchrun-style launcher. Runs --nproc-per-node copies of COMMAND on this node with\n"
      "torchrun's worker environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,\n"
      "GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, MASTER_ADDR, MASTER_PORT,\n"
      "TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_RUN_ID,\n"
      "TORCHELASTIC_USE_AGENT_STORE=False, OMP_NUM_THREADS=1 when unset and nproc > 1); the workers'\n"
      "rank 0 hosts the c10d store at MASTER_ADDR:MASTER_PORT, as with plain torch.distributed.\n"
      "Command line: launch [OPTIONS] [--] COMMAND [ARGS...]   (every option also takes _ for -)");
  app.footer(
      "Several nodes: run one launch per node with the same --nnodes, --master-addr, --master-port,\n"
      "--run-id and --max-restarts and its own --node-rank; node 0's launch serves the launchers'\n"
      "rendezvous at --rdzv-endpoint (default MASTER_ADDR:MASTER_PORT) and picks a free MASTER_PORT\n"
      "for the workers of each attempt.\n"
      "Worker output: prefixed \"[rank<r>]: \" on stdout/stderr, kept in\n"
      "LOG_DIR/<run_id>/attempt_<n>/rank_<r>.log. A failed worker stops and restarts the group on\n"
      "every node, up to --max-restarts times.\n"
      "Exit: 0 ok; the failed worker's code (128+signal if killed) past --max-restarts; 128+signal\n"
      "when interrupted; 2 bad input (one line); 1 other failures.");
}

void add_options(CLI::App& app, Options& o, RawNumbers& raw, bool& no_python) {
  app.add_option("--nproc-per-node,--nproc_per_node", raw.nproc, "Workers on this node (an integer >= 1)")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--nnodes", raw.nnodes, "Nodes in the job: N (or N:N)")
      ->type_name("INT")->capture_default_str();
  app.add_option("--node-rank,--node_rank", raw.node_rank, "This node's rank, 0..nnodes-1")
      ->type_name("INT")->capture_default_str();
  raw.master_addr = app.add_option("--master-addr,--master_addr", o.master_addr,
                                   "Address of node 0 (the workers' MASTER_ADDR)")
                        ->capture_default_str();
  app.add_option("--master-port,--master_port", raw.port,
                 "One node: the workers' MASTER_PORT; several: node 0's rendezvous port (see --rdzv-endpoint)")
      ->type_name("INT")->capture_default_str();
  app.add_option("--rdzv-endpoint,--rdzv_endpoint", raw.rdzv_endpoint,
                 "HOST:PORT where node 0's launch serves the launchers' rendezvous (default MASTER_ADDR:MASTER_PORT)");
  app.add_option("--max-restarts,--max_restarts", raw.restarts, "Worker group restarts before failing")
      ->type_name("INT")
      ->capture_default_str();
  app.add_option("--log-dir,--log_dir", o.log_dir, "Per-rank logs: LOG_DIR/<run_id>/attempt_<n>/rank_<r>.log")
      ->capture_default_str();
  app.add_flag("--standalone", o.standalone,
               "Single node: the workers get a free port of 127.0.0.1 at every attempt "
               "(ignores --master-addr/--master-port); "
               "the run id is random unless --run-id is given");
  raw.run_id = app.add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", o.run_id,
                              "Job id (TORCHELASTIC_RUN_ID), the same on every node")
                   ->capture_default_str();
  app.add_option("--role", o.role, "ROLE_NAME of the workers")->capture_default_str();
  app.add_option("--grace-period,--grace_period", o.grace_period_s,
                 "Seconds between SIGTERM (or a forwarded signal) and SIGKILL when stopping workers")
      ->capture_default_str();
  app.add_option("--monitor-interval,--monitor_interval", o.monitor_interval_s,
                 "Seconds between polls of node 0 for other nodes' failures and completion")
      ->capture_default_str();
  app.add_option("--rdzv-timeout,--rdzv_timeout", o.rdzv_timeout_s,
                 "Seconds to wait for node 0 and for all nodes at each attempt")
      ->capture_default_str();
  app.add_flag("--no-python,--no_python", no_python, "Accepted for torchrun compatibility (COMMAND always runs as is)");
  app.prefix_command();  // everything from COMMAND (or after --) on belongs to the command
}

// Runs CLI11 and takes COMMAND [ARGS...]; false after printing --help.
bool parse_command_line(CLI::App& app, int argc, char** argv, Options& o) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) {
      app.exit(e);
      return false;
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
  return true;
}

// Checks the numbers and the combinations; --standalone picks the address and the run id.
void check_options(const RawNumbers& raw, Options& o) {
  o.nproc_per_node = static_cast<int>(parse_int("--nproc-per-node", raw.nproc, 1, 1 << 16));
  if (auto colon = raw.nnodes.find(':'); colon != std::string::npos) {
    long lo = parse_int("--nnodes", raw.nnodes.substr(0, colon), 1, 1 << 20);
    long hi = parse_int("--nnodes", raw.nnodes.substr(colon + 1), 1, 1 << 20);
    if (lo != hi)
      throw UsageError(strf("--nnodes: elastic ranges (%s) are not supported; give one number", raw.nnodes.c_str()));
    o.nnodes = static_cast<int>(lo);
  } else {
    o.nnodes = static_cast<int>(parse_int("--nnodes", raw.nnodes, 1, 1 << 20));
  }
  o.node_rank = static_cast<int>(parse_int("--node-rank", raw.node_rank, 0, o.nnodes - 1));
  o.max_restarts = static_cast<int>(parse_int("--max-restarts", raw.restarts, 0, 1 << 20));
  if (o.standalone) {
    if (o.nnodes != 1 || o.node_rank != 0) throw UsageError("--standalone runs one node: drop --nnodes/--node-rank");
    o.master_addr = "127.0.0.1";
    o.master_port = 0;
    if (raw.run_id->count() == 0) {
      std::random_device rd;
      o.run_id = strf("%08x%08x", rd(), rd());
    }
  } else {
    o.master_port = static_cast<int>(parse_int("--master-port", raw.port, 1, 65535));
  }
  if (!raw.rdzv_endpoint.empty()) {
    if (o.standalone) throw UsageError("--standalone runs one node: drop --rdzv-endpoint");
    auto colon = raw.rdzv_endpoint.rfind(':');
    if (colon == std::string::npos || colon == 0)
      throw UsageError(strf("--rdzv-endpoint: expected HOST:PORT, got '%s'", raw.rdzv_endpoint.c_str()));
    o.rdzv_host = raw.rdzv_endpoint.substr(0, colon);
    if (o.rdzv_host.size() > 2 && o.rdzv_host.front() == '[' && o.rdzv_host.back() == ']')
      o.rdzv_host = o.rdzv_host.substr(1, o.rdzv_host.size() - 2);  // [v6 address]:port
    o.rdzv_port = static_cast<int>(parse_int("--rdzv-endpoint port", raw.rdzv_endpoint.substr(colon + 1), 1, 65535));
    o.rdzv_from_endpoint = true;
    if (raw.master_addr->count() == 0) o.master_addr = o.rdzv_host;  // node 0's host, for the workers too
  } else {
    o.rdzv_host = o.master_addr;
    o.rdzv_port = o.master_port;
  }
  if (o.master_addr.empty()) throw UsageError("--master-addr: empty");
  if (o.run_id.empty() || o.run_id.find('/') != std::string::npos || o.run_id == "." || o.run_id == "..")
    throw UsageError(strf("--run-id: '%s' is not usable as a directory name", o.run_id.c_str()));
  if (!(o.grace_period_s >= 0)) throw UsageError("--grace-period: must be >= 0");
  if (!(o.monitor_interval_s > 0)) throw UsageError("--monitor-interval: must be > 0");
  if (!(o.rdzv_timeout_s > 0)) throw UsageError("--rdzv-timeout: must be > 0");
}

}  // namespace

std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  RawNumbers raw;
  bool no_python = false;
  CLI::App app{"", "launch"};
  describe(app);
  add_options(app, o, raw, no_python);
  if (!parse_command_line(app, argc, argv, o)) return std::nullopt;
  check_options(raw, o);
  o.command_path = resolve_command(o.command[0]);
  std::error_code ec;
  fs::create_directories(fs::path(o.log_dir) / o.run_id, ec);
  if (ec)
    throw UsageError(strf("--log-dir: cannot create %s/%s: %s", o.log_dir.c_str(), o.run_id.c_str(),
                          ec.message().c_str()));
  return o;
}

}  // namespace lm::launch
