#!/usr/bin/env bash
# The C++ loader (packed and bucketed, 1 and 2 workers) vs the Python peers (bench/loader_peer.py:
# numpy memmap + torch DataLoader with 1 and 2 workers, and nanoGPT's get_batch in process) on the
# same shards, plus memcpy, in one run.
# Each configuration runs ROUNDS times, alternating C++ and peer; the median is reported.
#
# usage: bench/loader.sh [--data DIR] [--tokens N] [--seq T] [--batch B] [--rounds R]
#   --data: a prepared dataset; default: a synthetic one of --tokens (50M) tokens, deleted after.
# env: BUILD_DIR (default build) holding bin/loader_bench.
# Prints one JSON object: every run, and ratios C++/peer at equal workers (packed, tokens/s) and
# C++ output bytes/s / memcpy bytes/s, and C++ (best configuration) over the FASTEST peer
# configuration (ours runs in worker threads, so the training thread only pops a ready batch; the
# get_batch peer runs in the training thread). Goals: >= 5x the fastest peer; >= 0.5 of memcpy.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="" TOKENS=50000000 SEQ=1024 BATCH=16 ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --data) DATA=$2 ;; --tokens) TOKENS=$2 ;; --seq) SEQ=$2 ;; --batch) BATCH=$2 ;; --rounds) ROUNDS=$2 ;;
    *) echo "loader.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
BIN=${BUILD_DIR:-build}/bin/loader_bench
[ -x "$BIN" ] || { echo "loader.sh: $BIN missing (ninja -C ${BUILD_DIR:-build} loader_bench)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/lmloader.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if [ -z "$DATA" ]; then
  DATA=$WORK/data
  "$BIN" --generate "$DATA" --tokens "$TOKENS" --shard-tokens $((TOKENS / 8 + 1)) >&2
fi
# Enough batches for about a second of C++ work (it reads ~4e8 tokens/s on 2 cores).
CPP_BATCHES=$((400000000 / (SEQ * BATCH) + 1))
# The dataset into the page cache once, so that no run pays the first read.
cat "$DATA"/*.bin > /dev/null

for r in $(seq "$ROUNDS"); do
  for w in 1 2; do
    for mode in packed bucketed; do
      "$BIN" --data "$DATA" --mode $mode --workers $w --seq "$SEQ" --batch "$BATCH" --batches $CPP_BATCHES \
        $([ "$w$mode" = 1packed ] && echo --memcpy) >> "$WORK/cpp.jsonl"
    done
    /usr/bin/python3 bench/loader_peer.py "$DATA" --workers $w --seq "$SEQ" --batch "$BATCH" --batches 300 >> "$WORK/peer.jsonl"
  done
  /usr/bin/python3 bench/loader_peer.py "$DATA" --style getbatch --seq "$SEQ" --batch "$BATCH" --batches 300 >> "$WORK/peer.jsonl"
  echo "round $r done" >&2
done

/usr/bin/python3 - "$WORK/cpp.jsonl" "$WORK/peer.jsonl" <<'PY'
import json, statistics, sys
cpp = [json.loads(l) for l in open(sys.argv[1])]
peer = [json.loads(l) for l in open(sys.argv[2])]
med = lambda rows, key: statistics.median(r[key] for r in rows)
out = {"cpp": {}, "peer": {}, "ratios": {}}
for mode in ("packed", "bucketed"):
    for w in (1, 2):
        rows = [r for r in cpp if r["mode"] == mode and r["workers"] == w]
        out["cpp"][f"{mode}_w{w}"] = {k: med(rows, k) for k in ("tokens_per_s", "bytes_per_s", "pad_fraction",
                                                               "mean_wait_ms", "peak_rss_anon_kb")}
for w in (1, 2):
    out["peer"][f"packed_w{w}"] = {k: med([r for r in peer if r["style"] == "dataloader" and r["workers"] == w], k)
                                   for k in ("tokens_per_s", "bytes_per_s")}
out["peer"]["getbatch"] = {k: med([r for r in peer if r["style"] == "getbatch"], k) for k in ("tokens_per_s", "bytes_per_s")}
memcpy = statistics.median(r["memcpy_bytes_per_s"] for r in cpp if "memcpy_bytes_per_s" in r)
out["memcpy_bytes_per_s"] = memcpy
for w in (1, 2):
    out["ratios"][f"cpp_over_peer_packed_w{w}"] = round(out["cpp"][f"packed_w{w}"]["tokens_per_s"] / out["peer"][f"packed_w{w}"]["tokens_per_s"], 1)
    for mode in ("packed", "bucketed"):
        out["ratios"][f"{mode}_w{w}_bytes_over_memcpy"] = round(out["cpp"][f"{mode}_w{w}"]["bytes_per_s"] / memcpy, 3)
fastest = max(out["peer"], key=lambda k: out["peer"][k]["tokens_per_s"])
for w in (1, 2):
    out["ratios"][f"cpp_packed_w{w}_over_fastest_peer"] = round(out["cpp"][f"packed_w{w}"]["tokens_per_s"] / out["peer"][fastest]["tokens_per_s"], 1)
out["fastest_peer"] = fastest
out["goals"] = {"cpp_5x_fastest_peer": max(out["ratios"][f"cpp_packed_w{w}_over_fastest_peer"] for w in (1, 2)) >= 5,
                "packed_half_memcpy": max(out["ratios"][f"packed_w{w}_bytes_over_memcpy"] for w in (1, 2)) >= 0.5}
print(json.dumps(out, indent=1))
PY
