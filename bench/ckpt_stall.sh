#!/usr/bin/env bash
# The real stall of checkpoint saves in a training loop (bench/ckpt_stall.cpp): GPT-2 124M on CPU,
# parameters + AdamW moments = 1.5 GB of state, side by side in one run: the synchronous save (the
# baseline: the trainer's own sync save, checkpoint.async false, which writes through the page
# cache and fsyncs), the async save as the trainer does it (staged copy + writer thread, direct
# I/O) unpaced (mode thread) and paced (mode paced: its writes spread over --pace of the interval,
# --interval steps times the mean step; checkpoint.write_pace). Goal: the async stall <= 5% of the
# sync save. (The forked writer it replaced was compared in commit 223b6ab.)
# Mode nowrite is the async save with its disk writes discarded (the trainer's own part of the
# stall); "steal ms" is the CPU time the hypervisor took from this machine's CPUs during the save
# (on a VM the host's side of the disk writes can run on our cores: bench/steal.sh measures that).
# The output names the machine (CPU model, CPUs, the hypervisor's steal over the whole run, the
# load before and after): stalls differ per machine, report them with it.
# usage: bench/ckpt_stall.sh [DIR] [extra ckpt_stall flags, e.g. --rounds 6 --ema --no-prepare
#                                   --modes sync,thread,paced --interval 40 --pace 0.5]
# Medians over rounds 1.. ("first save ms", round 0, is left out of them: each Checkpointer's first
# save; --no-prepare: without the staging buffer allocated and faulted in at start, as before
# Checkpointer::prepare(); a paced save's first has no measured write time yet).
#   OPENBLAS_NUM_THREADS=1 bench/ckpt_stall.sh: training on one core leaves the writer the other,
#   as on a GPU host, where training runs on the device and the host has cores to spare.
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-/tmp}
shift || true
[ -x build/bin/ckpt_stall ] || ninja -C build ckpt_stall >&2
WORK=$(mktemp -d "$BASE/lmstall.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs" >&2
build/bin/ckpt_stall --dir "$WORK" "$@" | tee "$WORK/out.jsonl" >&2
tail -n 1 "$WORK/out.jsonl" | /usr/bin/python3 -c '
import json, sys
o = json.load(sys.stdin)
print("machine: %s, %d CPUs, hypervisor steal %.1f%% of all CPU time over the run" % (o["cpu_model"], o["cpus"], o["run_steal_pct"]))
print("state %.0f MB, step %.0f ms (median without a save); training threads: %d intra-op, OpenBLAS %s; interval %d steps, pace %.2f; medians over %s" % (
    o["state_mb"], o["step_ms"], o["intra_op_threads"], o["blas_threads"], o["interval_steps"], o["pace"], o["medians_over"]))
print("sync = " + o["sync_is"])
print("%-7s %10s %10s %12s %14s %10s %11s %9s %9s %15s" % ("mode", "stall ms", "% of sync", "reported ms", "peak extra MB",
                                                         "steal ms", "in flight s", "pace ms", "slept ms", "first save ms"))
for m in ("sync", "thread", "paced", "nowrite"):
    if m + "_stall_ms" in o:
        print("%-7s %10.0f %10.1f %12.0f %14.0f %10.0f %11.1f %9.0f %9.0f %15.0f" % (m, o[m + "_stall_ms"], o.get(m + "_pct_of_sync", 0),
              o[m + "_reported_ms"], o[m + "_peak_extra_mb"], o[m + "_steal_ms"], o[m + "_inflight_s"], o[m + "_pace_ms"],
              o[m + "_slept_ms"], o[m + "_first_stall_ms"]))
'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
