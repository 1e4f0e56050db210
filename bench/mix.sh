#!/usr/bin/env bash
# Data mixtures (data.sources) against the one-source loader, side by side in one run: loader
# tokens/s with 1, 3 and 10 sources over the same synthetic shards (goal: at most 10% slower than
# data.train), and the loader's start-up time on a dataset of 10,000 shards (goal: under 10 s on 2
# cores; each shard is opened once for its header and sizes, never scanned: checksums are lazy).
# usage: bench/mix.sh [--tokens N] [--rounds R]    env: BUILD_DIR (default build)
# Prints JSON lines (every run) and one summary line with the ratios (median of R rounds).
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENS=20000000 ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in --tokens) TOKENS=$2 ;; --rounds) ROUNDS=$2 ;; *) echo "mix.sh: unknown option $1" >&2; exit 2 ;; esac
  shift 2
done
BIN=${BUILD_DIR:-build}/bin/loader_bench
[ -x "$BIN" ] || { echo "mix.sh: $BIN missing (ninja -C ${BUILD_DIR:-build} loader_bench)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/lmmix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
"$BIN" --generate "$WORK/data" --tokens "$TOKENS" --shard-tokens $((TOKENS / 8 + 1)) >&2
"$BIN" --generate "$WORK/many" --tokens 10000000 --shard-tokens 1000 >&2   # 10,000 train shards
cat "$WORK"/data/*.bin > /dev/null
for r in $(seq "$ROUNDS"); do
  for mode in packed bucketed; do
    for n in 0 1 3 10; do
      "$BIN" --data "$WORK/data" --mode $mode --sources $n --seq 1024 --batch 16 --batches 600 | tee -a "$WORK/runs.jsonl"
    done
  done
  for n in 0 1; do
    "$BIN" --data "$WORK/many" --sources $n --seq 1024 --batch 16 --batches 20 --warmup 0 | tee -a "$WORK/many.jsonl"
  done
done
/usr/bin/python3 - "$WORK/runs.jsonl" "$WORK/many.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
many = [json.loads(l) for l in open(sys.argv[2])]
out = {}
for mode in ("packed", "bucketed"):
    med = lambda n: statistics.median(r["tokens_per_s"] for r in runs if r["mode"] == mode and r["sources"] == n)
    base = med(0)
    out[mode] = {"data.train_tokens_per_s": round(base), **{f"ratio_{n}_sources": round(med(n) / base, 3) for n in (1, 3, 10)}}
out["startup_s_10000_shards"] = {("data.train" if n == 0 else "1 source"): statistics.median(r["startup_s"] for r in many if r["sources"] == n) for n in (0, 1)}
print(json.dumps(out))
PY
