#!/usr/bin/env bash
# Example Slurm batch script: a multi-node training job with build/bin/launch.
#
# Slurm starts ONE task per node (srun below); each task runs `launch`, which starts one trainer
# per GPU on its node and gives it torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).
# Node 0's launch serves the launchers' rendezvous at MASTER_ADDR:MASTER_PORT; the others connect to
# it. Node 0 picks a free port for the trainers' c10d store (hosted by rank 0) at every (re)start.
# When a trainer fails, every node's launch stops its trainers and all restart together, up to
# --max-restarts times (the trainer resumes from its last checkpoint).
#
#   sbatch launch/sbatch_example.sh [CONFIG.yaml] [key=value ...]
#
# Adjust the #SBATCH lines to your cluster (partition, account, GPUs per node).
#SBATCH --job-name=lmtrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1        # one launcher per node; it forks the per-GPU workers itself
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64         # all of the node's cores for the launcher and its workers
#SBATCH --time=24:00:00
#SBATCH --output=slurm-%j.out
# SIGTERM 120 s before the time limit: launch forwards it to the trainers (which write a
# checkpoint), then SIGKILLs stragglers after --grace-period.
#SBATCH --signal=TERM@120

set -euo pipefail
cd "${SLURM_SUBMIT_DIR:-.}"

CONFIG=${1:-configs/gpt2-124m.yaml}
shift || true

# Node 0 of the allocation serves the rendezvous: the first host of the node list.
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# A port derived from the job id, so two jobs sharing a node do not collide.
MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_ON_NODE:-8}}
export CONFIG MASTER_ADDR MASTER_PORT GPUS_PER_NODE

echo "job $SLURM_JOB_ID: $SLURM_NNODES node(s) x $GPUS_PER_NODE GPU(s), rendezvous at $MASTER_ADDR:$MASTER_PORT"

# srun runs the quoted command once per node; SLURM_NODEID (0..nnodes-1) is evaluated there, so
# it is in single quotes. --kill-on-bad-exit ends the other nodes when one launch gives up.
# Per-rank logs: runs/launch_logs/<job id>/attempt_<n>/rank_<r>.log (on a shared filesystem, all
# nodes' ranks land side by side).
srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c '
  exec build/bin/launch \
    --nnodes "$SLURM_NNODES" \
    --node-rank "$SLURM_NODEID" \
    --nproc-per-node "$GPUS_PER_NODE" \
    --master-addr "$MASTER_ADDR" \
    --master-port "$MASTER_PORT" \
    --run-id "$SLURM_JOB_ID" \
    --max-restarts 3 \
    --grace-period 60 \
    --log-dir runs/launch_logs \
    -- build/bin/trainer "$CONFIG" "$@"
' bash "$@"
