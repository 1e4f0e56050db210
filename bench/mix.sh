#!/usr/bin/env bash
# Data mixtures (data.sources) against the one-source loader, side by side in one run: loader
# tokens/s with 1, 3 and 10 sources (goal: at most 10% slower than data.train), and the loader's
# start-up time on a dataset of 10,000 shards (goal: under 10 s on 2
# cores; each shard is opened once for its header and sizes, never scanned: checksums are lazy).
# Data (synthetic, bytes tokenizer, shards of --tokens/80 tokens everywhere): every variant reads
# the same total: data.train and the 1-source mixture one dataset of --tokens; the n-source mixture
# (n = 3, 10; loader_bench weighs source i by i+1) n distinct datasets (as a real mixture's sources
# are distinct: n sources over one directory would open, map and verify the same shards n times)
# of --tokens * (i+1) / (1 + ... + n) each: --tokens in all, each source sized to its share of the
# reads, so every variant spans the same tokens in about as many shards, at the same pace.
# Timed window of each run: --batches batches of 16 x 1024 popped from the loader's next() (2
# worker threads, prefetch 4) after 20 warm-up batches; shard files are in the page cache (read
# once before). Each round runs every variant once, in an order rotated round by round, and a
# round's ratio compares variants of the same round (so drift between rounds cancels); the summary
# gives the median ratio over rounds and its range (min..max).
# usage: bench/mix.sh [--tokens N] [--rounds R] [--batches N]    env: BUILD_DIR (default build)
# Prints JSON lines (every run) and one summary line.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENS=200000000 ROUNDS=7 BATCHES=12000
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) TOKENS=$2 ;; --rounds) ROUNDS=$2 ;; --batches) BATCHES=$2 ;;
    *) echo "mix.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
BIN=${BUILD_DIR:-build}/bin/loader_bench
[ -x "$BIN" ] || { echo "mix.sh: $BIN missing (ninja -C ${BUILD_DIR:-build} loader_bench)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/lmmix.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs" >&2
SHARD=$((TOKENS / 80 + 1))
"$BIN" --generate "$WORK/data" --tokens "$TOKENS" --shard-tokens $SHARD >&2
for n in 3 10; do  # source i of the n-source mixture: its weight's share of TOKENS
  for i in $(seq 0 $((n - 1))); do
    "$BIN" --generate "$WORK/src$n.$(printf %02d $i)" --tokens $((TOKENS * (i + 1) * 2 / (n * (n + 1)))) \
      --shard-tokens $SHARD --seed $((n * 100 + i + 1)) >&2
  done
done
"$BIN" --generate "$WORK/many" --tokens 10000000 --shard-tokens 1000 >&2   # 10,000 train shards
cat "$WORK"/data/*.bin "$WORK"/src*/*.bin > /dev/null
src() {  # the --source-data of an n-source mixture
  case $1 in 3|10) ls -d "$WORK/src$1".* | paste -sd, ;; *) echo "" ;; esac
}
# Every variant's datasets hold the same tokens (the dataset sizes, in bytes, say so).
for n in 0 3 10; do
  case $n in 0) d="$WORK/data" ;; *) d=$(ls -d "$WORK/src$n".*) ;; esac
  echo "variant $n sources: $(cat $(for x in $d; do ls "$x"/*.bin; done) | wc -c) bytes of shards" >&2
done
variants=(0 1 3 10)
for r in $(seq "$ROUNDS"); do
  for mode in packed bucketed; do
    for i in 0 1 2 3; do
      n=${variants[$(( (i + r) % 4 ))]}
      dirs=$(src $n)
      "$BIN" --data "$WORK/data" ${dirs:+--source-data "$dirs"} --mode $mode --sources $n --seq 1024 --batch 16 --batches "$BATCHES" \
        | sed "s/^{/{\"round\": $r, /" | tee -a "$WORK/runs.jsonl"
    done
  done
  for n in 0 1; do
    "$BIN" --data "$WORK/many" --sources $n --seq 1024 --batch 16 --batches 20 --warmup 0 | tee -a "$WORK/many.jsonl"
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
/usr/bin/python3 - "$WORK/runs.jsonl" "$WORK/many.jsonl" "$BATCHES" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
many = [json.loads(l) for l in open(sys.argv[2])]
out = {"window": "%s batches of 16 x 1024 from next(), 2 workers, after 20 warm-up batches" % sys.argv[3],
       "data": "every variant reads datasets of the same total tokens: one of N; n sources of N*(i+1)/(1+..+n), source i weighted i+1"}
for mode in ("packed", "bucketed"):
    tps = {(r["round"], r["sources"]): r["tokens_per_s"] for r in runs if r["mode"] == mode}
    rounds = sorted({k[0] for k in tps})
    res = {"data.train_tokens_per_s": round(statistics.median(tps[(r, 0)] for r in rounds)),
           "seconds_per_run": round(statistics.median(x["seconds"] for x in runs if x["mode"] == mode), 2)}
    for n in (1, 3, 10):
        ratios = [tps[(r, n)] / tps[(r, 0)] for r in rounds]
        res[f"ratio_{n}_sources"] = round(statistics.median(ratios), 3)
        res[f"ratio_{n}_sources_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    if mode == "bucketed":  # padding: a mixture buckets within each batch, one source buckets across 64
        res["pad_fraction"] = {("data.train" if n == 0 else f"{n}_sources"): statistics.median(
            x["pad_fraction"] for x in runs if x["mode"] == mode and x["sources"] == n) for n in (0, 1, 3, 10)}
    out[mode] = res
out["startup_s_10000_shards"] = {("data.train" if n == 0 else "1 source"): statistics.median(r["startup_s"] for r in many if r["sources"] == n) for n in (0, 1)}
print(json.dumps(out))
PY
