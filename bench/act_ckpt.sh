#!/usr/bin/env bash
# Activation checkpointing on CPU (train.activation_checkpointing), in one run: peak memory and step
# time with none and with block, side by side, for the kjv shape (configs/kjv.yaml: GPT, 4 layers,
# d 256, B 16, T 128) and the same model at 4x the sequence (model.seq_len=512).
#   peak RSS  /usr/bin/time -f %M of the whole trainer process: weights, gradients and AdamW state,
#             the loader, the activations, LibTorch's and the host allocator's caches, start-up and
#             the final checkpoint save included.
#   step ms   the median of the train records' step_ms (log.every_steps=1) over steps 3..N: step 1
#             measures the SGEMM peak, step 2 warms the allocator up. A step is data wait, forward,
#             backward (with block: the blocks' reruns), clipping and AdamW; one intra-op thread.
# The per-step losses of none and block are compared too (they are bit-identical by design).
# usage: bench/act_ckpt.sh [--steps N] [--data DIR]   (DIR: shards/kjv, made by launch/kjv.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=20
DATA=shards/kjv
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --data) DATA=$2; shift 2 ;;
    *) echo "usage: bench/act_ckpt.sh [--steps N] [--data DIR]" >&2; exit 2 ;;
  esac
done
[ "$STEPS" -ge 4 ] || { echo "act_ckpt.sh: --steps must be >= 4 (steps 1-2 are left out)" >&2; exit 2; }
[ -f "$DATA/manifest.json" ] || { echo "act_ckpt.sh: no dataset at $DATA (run launch/kjv.sh first, or --data DIR)" >&2; exit 2; }
[ -x build/bin/trainer ] || bash launch/build.sh trainer lm_tokenizer >&2
WORK=$(mktemp -d /tmp/lmactckpt.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
base=(configs/kjv.yaml "data.train=$DATA" "train.max_steps=$STEPS" log.every_steps=1 eval.every_steps=0 eval.batches=0
      checkpoint.every_steps=0 train.threads=1 log.tensorboard=false)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
run() {  # NAME OVERRIDES...: the run in $WORK/NAME, its peak RSS (KB) in $WORK/NAME.rss
  local name=$1
  shift
  if ! /usr/bin/time -f %M -o "$WORK/$name.rss" build/bin/trainer "${base[@]}" "run.dir=$WORK/$name" "$@" \
       >"$WORK/$name.log" 2>&1; then
    echo "act_ckpt.sh: the trainer failed ($name):" >&2
    tail -5 "$WORK/$name.log" >&2
    exit 1
  fi
}
for shape in kjv x4; do
  extra=()
  [ "$shape" = x4 ] && extra=(model.seq_len=512)
  for mode in none block; do
    echo "act_ckpt.sh: $shape, train.activation_checkpointing=$mode ($STEPS steps)" >&2
    run "${shape}_$mode" "${extra[@]}" "train.activation_checkpointing=$mode"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$WORK" "$STEPS" "$load_before" "$load_after" <<'PY'
import json, os, statistics, sys
work, steps, load_before, load_after = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {cpu}, {os.cpu_count()} cores; load average {load_before} before, {load_after} after")
print(f"window: steps 3..{steps} of {steps} (median step_ms); peak RSS of the whole process (/usr/bin/time %M)")
print(f"{'shape':<26}{'mode':<7}{'peak RSS MB':>12}{'x none':>8}{'step ms':>10}{'x none':>8}{'tokens/s':>10}  losses")
for shape, label in (("kjv", "kjv (B 16, T 128)"), ("x4", "4x sequence (B 16, T 512)")):
    rows = {}
    for mode in ("none", "block"):
        recs = [json.loads(l) for l in open(f"{work}/{shape}_{mode}/metrics.jsonl")]
        train = [r for r in recs if r["kind"] == "train"]
        rss_mb = int(open(f"{work}/{shape}_{mode}.rss").read().split()[-1]) / 1024
        window = [r["step_ms"] for r in train if r["step"] >= 3]
        toks = statistics.median(r["tokens_per_s"] for r in train if r["step"] >= 3)
        rows[mode] = (rss_mb, statistics.median(window), toks, [r["loss"] for r in train])
    for mode in ("none", "block"):
        rss, ms, toks, losses = rows[mode]
        same = "" if mode == "none" else ("bit-identical" if losses == rows["none"][3] else "DIFFER")
        print(f"{label if mode == 'none' else '':<26}{mode:<7}{rss:>12.0f}{rss / rows['none'][0]:>8.2f}{ms:>10.0f}"
              f"{ms / rows['none'][1]:>8.2f}{toks:>10.0f}  {same}")
PY
