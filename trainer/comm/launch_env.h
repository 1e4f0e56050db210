// The launch contract: which rank this process is, read from the environment that torchrun,
// build/bin/launch or Slurm set (LaunchEnv::from_environment is the only reader of these variables).
//
// Launch contract (LaunchEnv::from_environment, the only reader of these variables):
//   torchrun / build/bin/launch: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
//     MASTER_PORT, TORCHELASTIC_RESTART_COUNT. Rank 0 hosts the c10d TCPStore at MASTER_ADDR:MASTER_PORT and
//     the others connect (TORCHELASTIC_USE_AGENT_STORE=False or unset: build/bin/launch, torchrun's c10d
//     rendezvous); with TORCHELASTIC_USE_AGENT_STORE=True (torchrun's static rendezvous) torchrun's agent hosts
//     it and every rank connects as a client under the prefix /worker/attempt_<restart count>.
//   Slurm (srun), when RANK is unset: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
//     SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE; MASTER_ADDR (else the first host of
//     SLURM_JOB_NODELIST) and MASTER_PORT (else 29500).
//   Neither: a single process, no process group.
#pragma once

#include <string>

namespace lm {

struct LaunchEnv {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;
  bool agent_store = false;
  std::string source = "single";  // torchrun | slurm | single
  // Reads the variables above. Throws UsageError naming a malformed variable.
  static LaunchEnv from_environment();
};

}  // namespace lm
