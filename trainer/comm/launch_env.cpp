// The launch contract (see launch_env.h).
#include "trainer/comm/launch_env.h"

#include <cstdlib>
#include <string>

#include "common/errors.h"

namespace lm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

int env_int(const char* name, int fallback) {
  const char* v = env(name);
  if (!v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 30))
    throw UsageError(std::string("environment variable ") + name + "='" + v + "' is not a non-negative integer");
  return static_cast<int>(x);
}

// First host of a Slurm node list: "gpu[03-05,9],cpu1" -> "gpu03".
std::string first_slurm_host(const std::string& list) {
  std::string host;
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (c == ',') break;
    if (c == '[') {
      size_t j = i + 1;
      while (j < list.size() && std::isdigit(static_cast<unsigned char>(list[j]))) host += list[j++];
      break;
    }
    host += c;
  }
  return host;
}

// First line of an exception message (c10 errors carry backtraces).
}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  LaunchEnv e;
  if (env("RANK") || env("WORLD_SIZE")) {
    e.source = "torchrun";
    e.rank = env_int("RANK", 0);
    e.world_size = env_int("WORLD_SIZE", 1);
    e.local_rank = env_int("LOCAL_RANK", e.rank);
    e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
    e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
    const char* agent = env("TORCHELASTIC_USE_AGENT_STORE");
    e.agent_store = agent && std::string(agent) == "True";
  } else if (env("SLURM_PROCID") && env_int("SLURM_NTASKS", 1) > 1) {
    e.source = "slurm";
    e.rank = env_int("SLURM_PROCID", 0);
    e.world_size = env_int("SLURM_NTASKS", 1);
    e.local_rank = env_int("SLURM_LOCALID", 0);
    e.local_world_size = env_int("SLURM_NTASKS_PER_NODE", 0);
    if (e.local_world_size == 0 && env("SLURM_TASKS_PER_NODE"))  // "4(x2)" -> 4
      e.local_world_size = std::atoi(env("SLURM_TASKS_PER_NODE"));
    if (e.local_world_size == 0) e.local_world_size = 1;
    e.restart_count = env_int("SLURM_RESTART_COUNT", 0);
  } else {
    return e;
  }
  if (e.world_size < 1 || e.rank >= e.world_size)
    throw UsageError("rank " + std::to_string(e.rank) + " is outside world size " + std::to_string(e.world_size));
  if (env("MASTER_ADDR")) e.master_addr = env("MASTER_ADDR");
  else if (e.source == "slurm" && env("SLURM_JOB_NODELIST")) e.master_addr = first_slurm_host(env("SLURM_JOB_NODELIST"));
  e.master_port = env_int("MASTER_PORT", 29500);
  if (e.world_size > 1 && e.master_addr.empty())
    throw UsageError("MASTER_ADDR is not set (needed for a world size of " + std::to_string(e.world_size) + ")");
  if (e.master_port < 1 || e.master_port > 65535)
    throw UsageError("environment variable MASTER_PORT=" + std::to_string(e.master_port) + " is not a port");
  return e;
}

// ---- Comm ------------------------------------------------------------------------------------

}  // namespace lm
