#!/usr/bin/env bash
# Data parallelism on CPU with Gloo, in one run:
#  1. all-reduce bandwidth for bucket sizes 1..100 MB (2 ranks, build/bin/dist_bench via launch);
#  2. DDP overhead per step: 2 ranks x 1 thread vs 1 rank x 1 thread on the same per-rank batch,
#     scaling efficiency = tokens/s(2 ranks) / (2 x tokens/s(1 rank)).
# usage: bench/ddp.sh [--steps N]         (needs shards/kjv: run launch/kjv.sh first)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=40
[ "${1:-}" = "--steps" ] && STEPS=$2
[ -f shards/kjv/manifest.json ] || { echo "ddp.sh: run launch/kjv.sh first (needs shards/kjv)" >&2; exit 2; }
[ -x build/bin/dist_bench ] || bash launch/dev/build.sh >&2
WORK=$(mktemp -d /tmp/lmddp.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
ar=$(build/bin/launch --standalone --nproc-per-node 2 --log-dir "$WORK/logs" -- build/bin/dist_bench 2>/dev/null \
     | sed -n 's/^\[rank0\]: //p' | grep '^{')
args=(configs/kjv.yaml "train.max_steps=$STEPS" "log.every_steps=$STEPS" "eval.batches=0" "checkpoint.every_steps=0"
      "train.threads=1" "log.tensorboard=false")
build/bin/trainer "${args[@]}" "run.dir=$WORK/one" >/dev/null 2>&1
build/bin/launch --standalone --nproc-per-node 2 --log-dir "$WORK/logs" -- build/bin/trainer "${args[@]}" "run.dir=$WORK/two" >/dev/null 2>&1
/usr/bin/python3 - "$ar" "$WORK/one/summary.json" "$WORK/two/summary.json" <<'PY'
import json, sys
ar = json.loads(sys.argv[1]); one = json.load(open(sys.argv[2])); two = json.load(open(sys.argv[3]))
print(json.dumps({"allreduce": ar["allreduce"], "tokens_per_s_1rank": round(one["tokens_per_s"]),
                  "tokens_per_s_2ranks": round(two["tokens_per_s"]),
                  "scaling_efficiency": round(two["tokens_per_s"] / (2 * one["tokens_per_s"]), 3)}))
PY
