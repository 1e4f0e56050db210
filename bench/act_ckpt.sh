#!/usr/bin/env bash
# Activation checkpointing on CPU (train.activation_checkpointing), in one run: peak memory and step
# time with none and with block, side by side, for the kjv shape (configs/kjv.yaml: GPT, 4 layers,
# d 256, B 16, T 128) and the same model at 4x the sequence (model.seq_len=512).
#   rounds    none and block alternate, R rounds (default 3), the order flipped every other round
#             (none, block; block, none; ...) so that neither always runs first; each number is
#             the median over the rounds, and the rounds' values are printed beside it
#   peak RSS  /usr/bin/time -f %M of the whole trainer process: weights, gradients and AdamW state,
#             the loader, the activations, LibTorch's and the host allocator's caches, start-up and
#             the final checkpoint save included.
#   step ms   per run the median of the train records' step_ms (log.every_steps=1) over steps 3..N:
#             step 1 measures the SGEMM peak, step 2 warms the allocator up. A step is data wait,
#             forward, backward (with block: the blocks' reruns), clipping and AdamW; one intra-op
#             thread. Reported: the median of the runs' medians.
# The per-step losses of block are compared with none's of the same round (bit-identical by design),
# and every round's with the first's.
# usage: bench/act_ckpt.sh [--rounds R] [--steps N] [--data DIR]   (DIR: shards/kjv, made by launch/kjv.sh)
# Needs /usr/bin/time (Debian package `time`: launch/dev/deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
STEPS=20
DATA=shards/kjv
usage() { echo "usage: bench/act_ckpt.sh [--rounds R] [--steps N] [--data DIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --rounds) ROUNDS=$2 ;;
    --steps) STEPS=$2 ;;
    --data) DATA=$2 ;;
    *) usage ;;
  esac
  shift 2
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "act_ckpt.sh: --rounds must be a whole number >= 1, got '$ROUNDS'" >&2; exit 2; }
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 4 ] ||
  { echo "act_ckpt.sh: --steps must be a whole number >= 4 (steps 1-2 are left out), got '$STEPS'" >&2; exit 2; }
[ -f "$DATA/manifest.json" ] || { echo "act_ckpt.sh: no dataset at $DATA (run launch/kjv.sh first, or --data DIR)" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "act_ckpt.sh: /usr/bin/time missing (Debian package time: bash launch/dev/deps.sh)" >&2; exit 2; }
[ -x build/bin/trainer ] || bash launch/dev/build.sh trainer lm_tokenizer >&2
WORK=$(mktemp -d /tmp/lmactckpt.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
base=(configs/kjv.yaml "data.train=$DATA" "train.max_steps=$STEPS" log.every_steps=1 eval.every_steps=0 eval.batches=0
      checkpoint.every_steps=0 train.threads=1 log.tensorboard=false)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s)
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
for r in $(seq "$ROUNDS"); do
  modes=(none block)
  [ $((r % 2)) = 0 ] && modes=(block none)
  for shape in kjv x4; do
    extra=()
    [ "$shape" = x4 ] && extra=(model.seq_len=512)
    for mode in "${modes[@]}"; do
      echo "act_ckpt.sh: round $r/$ROUNDS, $shape, train.activation_checkpointing=$mode ($STEPS steps)" >&2
      run "${shape}_${mode}_$r" "${extra[@]}" "train.activation_checkpointing=$mode"
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$WORK" "$STEPS" "$ROUNDS" "$load_before" "$load_after" "$(( $(date +%s) - t0 ))" <<'PY'
import json, os, statistics, sys
work, steps, rounds, load_before, load_after, wall = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {cpu}, {os.cpu_count()} cores; load average {load_before} before, {load_after} after ({wall} s)")
print(f"{rounds} rounds alternating none/block (order flipped every other round); window: steps 3..{steps} of {steps} "
      "(median step_ms per run); peak RSS of the whole process (/usr/bin/time %M); medians over the rounds")
print(f"{'shape':<26}{'mode':<7}{'peak RSS MB':>12}{'x none':>8}{'step ms':>10}{'x none':>8}{'tokens/s':>10}  "
      f"{'step ms per round':<22}losses")
out = []
for shape, label in (("kjv", "kjv (B 16, T 128)"), ("x4", "4x sequence (B 16, T 512)")):
    rows, losses = {}, {}
    for mode in ("none", "block"):
        rss, ms, toks = [], [], []
        for r in range(1, rounds + 1):
            d = f"{work}/{shape}_{mode}_{r}"
            train = [x for x in map(json.loads, open(f"{d}/metrics.jsonl")) if x["kind"] == "train"]
            rss.append(int(open(f"{d}.rss").read().split()[-1]) / 1024)
            ms.append(statistics.median(x["step_ms"] for x in train if x["step"] >= 3))
            toks.append(statistics.median(x["tokens_per_s"] for x in train if x["step"] >= 3))
            losses[(mode, r)] = [x["loss"] for x in train]
        rows[mode] = (statistics.median(rss), statistics.median(ms), statistics.median(toks), ms)
    # block against none of the same round (the design: bit-identical); and every round against the first
    same = all(losses[("block", r)] == losses[("none", r)] for r in range(1, rounds + 1))
    repeat = all(losses[(m, r)] == losses[(m, 1)] for m in ("none", "block") for r in range(1, rounds + 1))
    for mode in ("none", "block"):
        rss, ms, toks, per_round = rows[mode]
        verdict = "" if mode == "none" else (("bit-identical" if same else "DIFFER") +
                                              (", every round alike" if repeat else ", rounds differ"))
        print(f"{label if mode == 'none' else '':<26}{mode:<7}{rss:>12.0f}{rss / rows['none'][0]:>8.2f}{ms:>10.0f}"
              f"{ms / rows['none'][1]:>8.2f}{toks:>10.0f}  {' '.join(f'{x:.0f}' for x in per_round):<22}{verdict}")
        out.append({"shape": shape, "mode": mode, "peak_rss_mb": round(rss), "step_ms": round(ms, 1),
                    "tokens_per_s": round(toks), "step_ms_rounds": [round(x, 1) for x in per_round]})
    out[-1].update({"losses_block_equal_none": same, "losses_equal_across_rounds": repeat})
print(json.dumps({"rounds": rounds, "steps": steps, "rows": out}))
PY
