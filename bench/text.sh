#!/usr/bin/env bash
# Raw text (data.text) vs prepared shards, in one run on the King James Bible (Debian's bible-kjv):
#   1. tokenizing speed of ONE thread, bytes and sentencepiece BPE (4096 pieces): `prep index
#      --threads 1` reads, cuts, tokenizes and hashes every verse (the work a loader worker does
#      per chunk); tokens/s;
#   2. loader tokens/s over one epoch from a cold start (build/bin/loader_bench, packed, seq 256 x
#      16, 2 workers): BPE shards vs the raw text tokenized by the loader (later epochs find the
#      KJV's chunks tokenized in memory, so only the first measures tokenizing);
#   3. the kjv config (configs/kjv.yaml, STEPS steps, eval off) trained from the shards and from
#      the raw text: tokens/s, data wait (% of step time, the trainer's own window: the time next()
#      blocked), and the process's CPU seconds (user+sys), whose difference is what tokenizing cost.
# Each configuration runs ROUNDS times, alternating; medians are reported, with ratios raw/shards.
#
# usage: bench/text.sh [--rounds R] [--steps S]
# env: BUILD_DIR (default build). Prints one JSON object.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 STEPS=150
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2 ;; --steps) STEPS=$2 ;;
    *) echo "text.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
BIN=${BUILD_DIR:-build}/bin
WORK=$(mktemp -d /tmp/lmtext.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

bible -f "Gen1:1-Rev22:21" > "$WORK/kjv.txt"
"$BIN/prep" "$WORK/kjv.txt" --out "$WORK/kjv" --tokenizer sentencepiece --vocab-size 4096 --quiet >&2
MODEL=$WORK/kjv/tokenizer.model

# ---- 1. one thread's tokenizing speed
for r in $(seq "$ROUNDS"); do
  for tok in bytes bpe; do
    args=(--threads 1)
    [ $tok = bpe ] && args+=(--tokenizer sentencepiece --sp-model "$MODEL")
    rm -f "$WORK/kjv.txt.lmidx"
    "$BIN/prep" index "$WORK/kjv.txt" "${args[@]}" 2>&1 | sed -n 's/.* \([0-9]*\) tokens\/s on 1 threads.*/\1/p' \
      | /usr/bin/python3 -c "import json,sys; print(json.dumps({'tokenizer': '$tok', 'tokens_per_s': float(sys.stdin.read())}))" \
      >> "$WORK/tok.jsonl"
  done
done
rm -f "$WORK/kjv.txt.lmidx"

# ---- 2. loader tokens/s over the first epoch (every chunk tokenized inside the timed window; the
# index is built before it, in the start-up window, as a run's first start does)
BATCHES=$(( $(/usr/bin/python3 -c "import json; print(json.load(open('$WORK/kjv/manifest.json'))['shards'][0]['tokens'])") / (16 * 257) - 8 ))
for r in $(seq "$ROUNDS"); do
  "$BIN/loader_bench" --data "$WORK/kjv" --seq 256 --batch 16 --batches $BATCHES --warmup 0 \
    | sed 's/^{/{"source": "shards", /' >> "$WORK/loader.jsonl"
  rm -rf "$WORK/cache"
  "$BIN/loader_bench" --data "$WORK/kjv.txt" --text line --tokenizer "$MODEL" --cache-dir "$WORK/cache" --seq 256 \
    --batch 16 --batches $BATCHES --warmup 0 | sed 's/^{/{"source": "raw", /' >> "$WORK/loader.jsonl"
done

# ---- 3. the kjv config from shards and from raw text
for r in $(seq "$ROUNDS"); do
  for src in shards raw; do
    data=(data.train="$WORK/kjv")
    [ $src = raw ] && data=(data.train="$WORK/kjv.txt" data.text=line data.tokenizer="$MODEL" data.cache_dir="$WORK/cache")
    rm -rf "$WORK/run"
    /usr/bin/time -f '%U %S' -o "$WORK/cpu" "$BIN/trainer" configs/kjv.yaml run.dir="$WORK/run" "${data[@]}" \
      train.max_steps="$STEPS" eval.batches=0 log.every_steps=10 checkpoint.every_steps=0 > "$WORK/kjv_$src.log" 2>&1 ||
      { cat "$WORK/kjv_$src.log" >&2; exit 1; }
    /usr/bin/python3 - "$WORK/run/metrics.jsonl" "$src" "$WORK/cpu" >> "$WORK/kjv.jsonl" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l]
recs = recs[1:] or recs  # the first window holds the start-up
n = len(recs)
user, sys_s = map(float, open(sys.argv[3]).read().split()[-2:])
print(json.dumps({"source": sys.argv[2], "tokens_per_s": sum(r["tokens_per_s"] for r in recs) / n,
                  "data_wait_pct": sum(r["data_wait_pct"] for r in recs) / n,
                  "data_wait_ms": sum(r["data_wait_ms"] for r in recs) / n, "cpu_s": user + sys_s}))
PY
  done
done

/usr/bin/python3 - "$WORK/tok.jsonl" "$WORK/loader.jsonl" "$WORK/kjv.jsonl" "$STEPS" <<'EOF'
import json, statistics, sys
tok, loader, kjv = ([json.loads(l) for l in open(p)] for p in sys.argv[1:4])
med = lambda rows, key, val, field: statistics.median(r[field] for r in rows if r[key] == val)
out = {
  "tokenize_tokens_per_s_one_thread": {t: med(tok, "tokenizer", t, "tokens_per_s") for t in ("bytes", "bpe")},
  "loader_tokens_per_s": {s: med(loader, "source", s, "tokens_per_s") for s in ("shards", "raw")},
  "kjv": {s: {k: med(kjv, "source", s, k) for k in ("tokens_per_s", "data_wait_pct", "data_wait_ms", "cpu_s")}
          for s in ("shards", "raw")},
  "kjv_steps": int(sys.argv[4]),
}
out["ratio_loader_raw_vs_shards"] = out["loader_tokens_per_s"]["raw"] / out["loader_tokens_per_s"]["shards"]
out["ratio_kjv_raw_vs_shards_tokens_per_s"] = out["kjv"]["raw"]["tokens_per_s"] / out["kjv"]["shards"]["tokens_per_s"]
# The CPU a tokenizing thread needs to keep up with training: training tokens/s over one thread's BPE speed.
out["tokenizing_cpu_share_of_one_core"] = out["kjv"]["raw"]["tokens_per_s"] / out["tokenize_tokens_per_s_one_thread"]["bpe"]
out["extra_cpu_s_raw_vs_shards"] = out["kjv"]["raw"]["cpu_s"] - out["kjv"]["shards"]["cpu_s"]
out["runs"] = {"tokenize": tok, "loader": loader, "kjv": kjv}
print(json.dumps(out, indent=1))
EOF
