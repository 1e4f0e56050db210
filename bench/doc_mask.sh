#!/usr/bin/env bash
# data.doc_mask on CPU: step time with the documents' mask off and on, on the kjv shape
# (configs/kjv.yaml: GPT, 4 layers, d 256, B 16, T 128; on LibTorch 1.13 the fused attention kernel,
# which with the mask computes each document's block alone).
#   rounds    off and on alternate, R rounds (default 3), the order flipped every other round
#   step ms   per run the median of the train records' step_ms (log.every_steps=1) over steps 3..N
#             (step 1 measures the SGEMM peak, step 2 warms the allocator up); reported: the median of
#             the runs' medians, and each round's beside it.
# usage: bench/doc_mask.sh [--rounds R] [--steps N] [--data DIR] [key=value ...]
#   (DIR: shards/kjv, made by launch/kjv.sh; the overrides go to every run, e.g. train.threads=1)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3
STEPS=30
DATA=shards/kjv
EXTRA=()
usage() { echo "usage: bench/doc_mask.sh [--rounds R] [--steps N] [--data DIR] [key=value ...]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds | --steps | --data)
      [ $# -ge 2 ] || usage
      case "$1" in --rounds) ROUNDS=$2 ;; --steps) STEPS=$2 ;; --data) DATA=$2 ;; esac
      shift 2 ;;
    *=*) EXTRA+=("$1"); shift ;;
    *) usage ;;
  esac
done
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "doc_mask.sh: --rounds must be a whole number >= 1, got '$ROUNDS'" >&2; exit 2; }
[[ "$STEPS" =~ ^[0-9]+$ ]] && [ "$STEPS" -ge 4 ] ||
  { echo "doc_mask.sh: --steps must be a whole number >= 4 (steps 1-2 are left out), got '$STEPS'" >&2; exit 2; }
[ -f "$DATA/manifest.json" ] || { echo "doc_mask.sh: no dataset at $DATA (run launch/kjv.sh first, or --data DIR)" >&2; exit 2; }
[ -x build/bin/trainer ] || bash launch/dev/build.sh trainer lm_tokenizer >&2
WORK=$(mktemp -d /tmp/lmdocmask.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
base=(configs/kjv.yaml "data.train=$DATA" "train.max_steps=$STEPS" log.every_steps=1 eval.every_steps=0 eval.batches=0
      checkpoint.every_steps=0 log.tensorboard=false)
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
t0=$(date +%s)
for r in $(seq "$ROUNDS"); do
  modes=(false true)
  [ $((r % 2)) = 0 ] && modes=(true false)
  for mode in "${modes[@]}"; do
    echo "doc_mask.sh: round $r/$ROUNDS, data.doc_mask=$mode ($STEPS steps)" >&2
    if ! build/bin/trainer "${base[@]}" "run.dir=$WORK/${mode}_$r" "data.doc_mask=$mode" "${EXTRA[@]}" \
         >"$WORK/${mode}_$r.log" 2>&1; then
      echo "doc_mask.sh: the trainer failed (data.doc_mask=$mode, round $r):" >&2
      tail -5 "$WORK/${mode}_$r.log" >&2
      exit 1
    fi
  done
done
grep -h "^.*attention: " "$WORK"/true_1.log "$WORK"/false_1.log | sed 's/^.*attention: /attention: /' || true
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$WORK" "$STEPS" "$ROUNDS" "$load_before" "$load_after" "$(( $(date +%s) - t0 ))" "${EXTRA[*]:-}" <<'PY'
import json, os, statistics, sys
work, steps, rounds, lb, la, wall, extra = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:8]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
print(f"machine: {cpu}, {os.cpu_count()} cores; load average {lb} before, {la} after ({wall} s); overrides: {extra or 'none'}")
print(f"{rounds} rounds alternating (order flipped every other round); median step_ms of steps 3..{steps} per run")
rows = {}
for mode in ("false", "true"):
    ms, toks = [], []
    for r in range(1, rounds + 1):
        train = [x for x in map(json.loads, open(f"{work}/{mode}_{r}/metrics.jsonl")) if x["kind"] == "train"]
        ms.append(statistics.median(x["step_ms"] for x in train if x["step"] >= 3))
        toks.append(statistics.median(x["tokens_per_s"] for x in train if x["step"] >= 3))
    rows[mode] = (statistics.median(ms), statistics.median(toks), ms)
for mode in ("false", "true"):
    ms, toks, per = rows[mode]
    print(f"data.doc_mask={mode:<6} step {ms:7.1f} ms  x off {ms / rows['false'][0]:5.3f}  {toks:7.0f} tokens/s  "
          f"rounds: {' '.join(f'{x:.1f}' for x in per)}")
PY
