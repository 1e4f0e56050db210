#!/usr/bin/env bash
# The real stall of checkpoint saves in a training loop (bench/ckpt_stall.cpp): GPT-2 124M on CPU,
# parameters + AdamW moments = 1.5 GB of state, side by side in one run: the synchronous save (the
# peer) and the async save as the trainer does it (staged copy + writer thread). Goal: the async
# stall <= 5% of the sync save. (The forked writer it replaced was compared in commit 223b6ab.)
# Mode nowrite is the async save with its disk writes discarded (the trainer's own part of the
# stall); "steal ms" is the CPU time the hypervisor took from this machine's CPUs during the save
# (on a VM the host's side of the disk writes can run on our cores: bench/steal.sh measures that).
# usage: bench/ckpt_stall.sh [DIR] [extra ckpt_stall flags, e.g. --rounds 6 --ema --no-prepare]
# "first save ms": the stall of each mode's first save (medians leave it out); --no-prepare: without
# the staging buffer allocated and faulted in at start, as before Checkpointer::prepare().
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
print("state %.0f MB, step %.0f ms (median without a save); training threads: %d intra-op, OpenBLAS %s" % (o["state_mb"], o["step_ms"], o["intra_op_threads"], o["blas_threads"]))
print("%-7s %12s %12s %12s %14s %12s %15s" % ("mode", "stall ms", "% of sync", "reported ms", "peak extra MB", "steal ms",
                                             "first save ms"))
for m in ("sync", "thread", "nowrite"):
    if m + "_stall_ms" in o:
        print("%-7s %12.0f %12.1f %12.0f %14.0f %12.0f %15.0f" % (m, o[m + "_stall_ms"], o.get(m + "_pct_of_sync", 0),
              o[m + "_reported_ms"], o[m + "_peak_extra_mb"], o[m + "_steal_ms"], o[m + "_first_stall_ms"]))
'
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
