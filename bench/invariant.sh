#!/usr/bin/env bash
# dist.invariant's cost on CPU with Gloo: tokens/s with and without it at world sizes 1, 2 and 4 on
# the kjv shape, the same global batch (G = 4 micro-batches: grad_accum 4, 2, 1), one thread per
# rank; and the gradient bytes each rank receives per step: the invariant all-gather's
# (W-1) x 4N against a ring all-reduce's 2 (W-1)/W x 4N (N parameters); and at 4 ranks the
# all-gather combine against recursive doubling (LM_INVARIANT_COMBINE), tokens/s and bytes.
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
run() {  # world, dist.invariant, run dir name
  local a=("${args[@]}" "train.grad_accum=$((4 / $1))" "dist.invariant=$2" "run.dir=$WORK/$3")
  if [ "$1" = 1 ]; then build/bin/trainer "${a[@]}" >/dev/null 2>&1
  else build/bin/launch --standalone --nproc-per-node "$1" --log-dir "$WORK/logs" -- build/bin/trainer "${a[@]}" >/dev/null 2>&1; fi
}
for w in 1 2 4; do
  for inv in false true; do run "$w" "$inv" "w${w}_$inv"; done
done
# At 4 ranks the two ways the ranks' subtree sums meet (trainer/parallel/global_batch.h), the same bits:
# all-gather (3 x 4N received per rank) and recursive doubling (2 x 4N, point to point).
for c in all-gather doubling; do LM_INVARIANT_COMBINE=$c run 4 true "w4_$c"; done
/usr/bin/python3 - "$WORK" <<'PY'
import json, sys
work = sys.argv[1]
rows = []
for w in (1, 2, 4):
    plain = json.load(open(f"{work}/w{w}_false/summary.json")); inv = json.load(open(f"{work}/w{w}_true/summary.json"))
    meta = json.load(open(f"{work}/w{w}_true/meta.json"))
    n = meta["model"]["params"]
    received = {"none": 0, "all-gather": w - 1, "recursive-doubling": max(1, w.bit_length() - 1)}[meta["parallelism"]["combine"]]
    rows.append({"world": w, "tokens_per_s": round(plain["tokens_per_s"]), "tokens_per_s_invariant": round(inv["tokens_per_s"]),
                 "ratio": round(inv["tokens_per_s"] / plain["tokens_per_s"], 3),
                 "mb_received_per_step_allreduce": round(4 * n * 2 * (w - 1) / w / 1e6, 2),
                 "combine": meta["parallelism"]["combine"], "mb_received_per_step_invariant": round(4 * n * received / 1e6, 2)})
ag = json.load(open(f"{work}/w4_all-gather/summary.json")); rd = json.load(open(f"{work}/w4_doubling/summary.json"))
n = json.load(open(f"{work}/w4_true/meta.json"))["model"]["params"]
combine = {"world": 4, "default": json.load(open(f"{work}/w4_true/meta.json"))["parallelism"]["combine"],
           "tokens_per_s_all_gather": round(ag["tokens_per_s"]), "tokens_per_s_doubling": round(rd["tokens_per_s"]),
           "ratio_doubling_to_all_gather": round(rd["tokens_per_s"] / ag["tokens_per_s"], 3),
           "mb_received_per_step_all_gather": round(4 * n * 3 / 1e6, 2), "mb_received_per_step_doubling": round(4 * n * 2 / 1e6, 2),
           "same_final_weights": open(f"{work}/w4_all-gather/model.safetensors", "rb").read() == open(f"{work}/w4_doubling/model.safetensors", "rb").read()}
print(json.dumps({"invariant_vs_plain": rows, "combine_at_4_ranks": combine}))
PY
