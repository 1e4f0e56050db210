#!/usr/bin/env bash
# dist.invariant's cost on CPU with Gloo: tokens/s with and without it at world sizes 1, 2 and 4 on
# the kjv shape, the same global batch (G = 4 micro-batches: grad_accum 4, 2, 1), one thread per
# rank; and the gradient bytes each rank receives per step: the invariant all-gather's
# (W-1) x 4N against a ring all-reduce's 2 (W-1)/W x 4N (N parameters).
# usage: bench/invariant.sh [--steps N]    (needs shards/kjv: run launch/kjv.sh first)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=30
[ "${1:-}" = "--steps" ] && STEPS=$2
[ -f shards/kjv/manifest.json ] || { echo "invariant.sh: run launch/kjv.sh first (needs shards/kjv)" >&2; exit 2; }
[ -x build/bin/launch ] && [ -x build/bin/trainer ] || bash launch/dev/build.sh trainer launch >&2
WORK=$(mktemp -d /tmp/lminv.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
args=(configs/kjv.yaml "train.max_steps=$STEPS" "log.every_steps=$STEPS" "eval.batches=0" "checkpoint.every_steps=0"
      "train.threads=1" "log.tensorboard=false")
for w in 1 2 4; do
  for inv in false true; do
    a=("${args[@]}" "train.grad_accum=$((4 / w))" "dist.invariant=$inv" "run.dir=$WORK/w${w}_$inv")
    if [ "$w" = 1 ]; then build/bin/trainer "${a[@]}" >/dev/null 2>&1
    else build/bin/launch --standalone --nproc-per-node "$w" --log-dir "$WORK/logs" -- build/bin/trainer "${a[@]}" >/dev/null 2>&1; fi
  done
done
/usr/bin/python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
rows = []
for w in (1, 2, 4):
    plain = json.load(open(f"{work}/w{w}_false/summary.json")); inv = json.load(open(f"{work}/w{w}_true/summary.json"))
    n = json.load(open(f"{work}/w{w}_true/meta.json"))["model"]["params"]
    rows.append({"world": w, "tokens_per_s": round(plain["tokens_per_s"]), "tokens_per_s_invariant": round(inv["tokens_per_s"]),
                 "ratio": round(inv["tokens_per_s"] / plain["tokens_per_s"], 3),
                 "mb_received_per_step_allreduce": round(4 * n * 2 * (w - 1) / w / 1e6, 2),
                 "mb_received_per_step_invariant": round(4 * n * (w - 1) / 1e6, 2)})
print(json.dumps(rows))
PY
