#!/usr/bin/env bash
# The data pipeline's cost inside training, on the kjv config (shards/kjv from launch/kjv.sh):
#  1. debt: step time with the streaming loader vs the same steps with one batch reused
#     (data.reuse_batch=true: no reading at all), and the loader's measured data-wait share;
#  2. padding: padding_pct of bucketed batching (the trainer's own number) vs random batching of
#     the same KJV verses (shuffled, cut into batches of the same size, padded the same way).
# usage: bench/pipeline.sh [--steps N] [--rounds R]      prints one JSON line
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=60 ROUNDS=2
while [ $# -gt 0 ]; do
  case "$1" in --steps) STEPS=$2 ;; --rounds) ROUNDS=$2 ;; *) echo "pipeline.sh: unknown option $1" >&2; exit 2 ;; esac
  shift 2
done
[ -f shards/kjv/manifest.json ] || { echo "pipeline.sh: run launch/kjv.sh first (needs shards/kjv)" >&2; exit 2; }
[ -x build/bin/trainer ] || bash launch/dev/build.sh >&2
WORK=$(mktemp -d /tmp/lmpipe.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
PY=/usr/bin/python3
common=(configs/kjv.yaml "train.max_steps=$STEPS" "log.every_steps=1" "eval.batches=0" "checkpoint.every_steps=0"
        "log.tensorboard=false")
# Mean step_ms and data_wait_pct over the logged steps after the first 5 (warm-up).
stats() { $PY - "$1/metrics.jsonl" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l][5:]
print(sum(x["step_ms"] for x in r) / len(r), sum(x["data_wait_pct"] for x in r) / len(r))
PY
}
loader_ms=() reuse_ms=() wait_pct=()
for r in $(seq "$ROUNDS"); do
  build/bin/trainer "${common[@]}" "run.dir=$WORK/loader$r" >/dev/null 2>&1
  read -r ms wp < <(stats "$WORK/loader$r"); loader_ms+=("$ms"); wait_pct+=("$wp")
  build/bin/trainer "${common[@]}" "run.dir=$WORK/reuse$r" data.reuse_batch=true >/dev/null 2>&1
  read -r ms _ < <(stats "$WORK/reuse$r"); reuse_ms+=("$ms")
  echo "round $r: loader ${loader_ms[-1]} ms/step (wait ${wait_pct[-1]}%), reused batch ${reuse_ms[-1]} ms/step" >&2
done
# Padding: the trainer in bucketed mode vs random batching of the same verses.
build/bin/trainer "${common[@]}" "run.dir=$WORK/bucketed" data.mode=bucketed "train.max_steps=$STEPS" >/dev/null 2>&1
$PY - "$WORK/bucketed/summary.json" shards/kjv "${loader_ms[*]}" "${reuse_ms[*]}" "${wait_pct[*]}" <<'PY'
import json, random, statistics, struct, sys
summary = json.load(open(sys.argv[1]))
loader = [float(x) for x in sys.argv[3].split()]; reuse = [float(x) for x in sys.argv[4].split()]
wait = [float(x) for x in sys.argv[5].split()]
# Document lengths from the shard indexes (data/format/FORMAT.md), each plus its EOS, cut at seq_len+1.
man = json.load(open(sys.argv[2] + "/manifest.json"))
lens = []
for s in man["shards"]:
    if s["split"] != "train": continue
    raw = open(sys.argv[2] + "/" + s["file"], "rb").read()
    d = struct.unpack_from("<Q", raw, 16)[0]
    offs = struct.unpack_from("<%dQ" % (d + 1), raw, 64)
    lens += [offs[i + 1] - offs[i] + 1 for i in range(d) if offs[i + 1] > offs[i]]
T, B, mult = 128, 16, 8   # configs/kjv.yaml: seq_len, micro_batch_size; data.pad_multiple default
rows = [min(l, T + 1) - 1 for l in lens]       # input positions per sample
random.seed(0); random.shuffle(rows)
pad = real = 0
for i in range(0, len(rows) - B + 1, B):
    b = rows[i:i + B]; width = min(T, -(-max(b) // mult) * mult)
    pad += width * len(b) - sum(b); real += sum(b)
lm, rm = statistics.median(loader), statistics.median(reuse)
print(json.dumps({"steps": int(summary["steps"]), "step_ms_loader": round(lm, 1), "step_ms_reused_batch": round(rm, 1),
                  "debt_pct": round(100 * (lm - rm) / lm, 2), "data_wait_pct": round(statistics.median(wait), 3),
                  "padding_pct_bucketed": round(summary.get("padding_pct", float("nan")), 2),
                  "padding_pct_random": round(100 * pad / (pad + real), 2)}))
PY
