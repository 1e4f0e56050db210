#!/usr/bin/env bash
# The C++ llama vs the independent Python peer (bench/llama_peer.py, PyTorch with /usr/bin/python3)
# on the same work, in one run: same shape, batch, precision (fp32), thread count, AdamW + clipping,
# on CPU. Then the cost of grouped-query attention: the same shape with n_kv_head = n_head and with
# n_kv_head < n_head, tokens/s and peak RSS, for both implementations.
# The peer trains on random ids; the trainer on real shards (bytes tokenizer, vocabulary padded to
# the peer's), so the FLOPs are the same. Rounds alternate peer/trainer so drift hits both; the
# median of each is reported.
#
# usage: bench/llama_vs_peer.sh [--threads N] [--rounds R] [--steps S] [--layers L --heads H
#                                --kv-heads K --dim D --seq T --batch B --vocab V]
# Prints one JSON line per kv-head setting: {"kv_heads":..., "peer_tokens_per_s":...,
# "cpp_tokens_per_s":..., "ratio":..., "peer_max_rss_mb":..., "cpp_max_rss_mb":..., ...}
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=1 ROUNDS=3 STEPS=10 LAYERS=4 HEADS=8 KV=2 DIM=256 SEQ=256 BATCH=8 VOCAB=4096
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2 ;; --rounds) ROUNDS=$2 ;; --steps) STEPS=$2 ;; --layers) LAYERS=$2 ;;
    --heads) HEADS=$2 ;; --kv-heads) KV=$2 ;; --dim) DIM=$2 ;; --seq) SEQ=$2 ;; --batch) BATCH=$2 ;;
    --vocab) VOCAB=$2 ;;
    *) echo "llama_vs_peer.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
PY=/usr/bin/python3
[ -x build/bin/trainer ] || bash launch/dev/build.sh >&2
WORK=$(mktemp -d /tmp/llamabench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if command -v bible >/dev/null; then bible -f "Gen1:1-Rev22:21" > "$WORK/corpus.txt"
else for i in $(seq 20000); do echo "in the beginning god created the heaven and the earth $i"; done > "$WORK/corpus.txt"; fi
build/bin/prep "$WORK/corpus.txt" --out "$WORK/data" --tokenizer bytes --quiet >&2
# The SwiGLU width both sides use: Llama's rule with multiple_of 256 (the C++ computes it itself).
FFN=$($PY -c "h=int(2*4*$DIM/3); print(256*((h+255)//256))")
# Runs a command, prints its stdout's last line, then its peak RSS in MB on a line of its own.
rss() { $PY -c 'import resource,subprocess,sys
out = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True).stdout.decode()
print(out.strip().splitlines()[-1] if out.strip() else "")
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)' "$@"; }

export OMP_NUM_THREADS=$THREADS
for kv in "$HEADS" "$KV"; do
  peer=() cpp=() peer_rss=() cpp_rss=()
  for r in $(seq "$ROUNDS"); do
    out=$(rss $PY bench/llama_peer.py --bench --threads "$THREADS" --layers "$LAYERS" --heads "$HEADS" \
            --kv-heads "$kv" --dim "$DIM" --ffn "$FFN" --seq "$SEQ" --batch "$BATCH" --vocab "$VOCAB" \
            --steps "$STEPS" --warmup 2)
    peer+=("$(echo "$out" | head -n 1 | $PY -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])')")
    peer_rss+=("$(echo "$out" | tail -n 1)")
    out=$(rss build/bin/trainer configs/llama-tiny.yaml "run.dir=$WORK/run_${kv}_$r" "data.train=$WORK/data" \
            "model.n_layer=$LAYERS" "model.n_head=$HEADS" "model.n_kv_head=$kv" "model.d_model=$DIM" \
            "model.seq_len=$SEQ" "model.ffn_multiple_of=256" "model.vocab_size=$VOCAB" \
            "train.micro_batch_size=$BATCH" "train.threads=$THREADS" "train.max_steps=$((STEPS + 2))" \
            "log.every_steps=$((STEPS + 2))" "eval.batches=0" "log.tensorboard=false" "checkpoint.every_steps=0")
    cpp_rss+=("$(echo "$out" | tail -n 1)")
    # summary.json tokens_per_s excludes the first step (warm-up).
    cpp+=("$($PY -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$WORK/run_${kv}_$r/summary.json")")
    echo "kv_heads $kv round $r: peer ${peer[-1]} tok/s ${peer_rss[-1]} MB, c++ ${cpp[-1]} tok/s ${cpp_rss[-1]} MB" >&2
  done
  $PY - "${peer[*]}" "${cpp[*]}" "${peer_rss[*]}" "${cpp_rss[*]}" <<PY
import json, statistics, sys
med = lambda s: statistics.median(float(x) for x in s.split())
p, c = med(sys.argv[1]), med(sys.argv[2])
print(json.dumps({"kv_heads": $kv, "shape": {"layers": $LAYERS, "heads": $HEADS, "dim": $DIM, "ffn": $FFN,
                  "seq": $SEQ, "batch": $BATCH, "vocab": $VOCAB, "dtype": "fp32", "threads": $THREADS,
                  "steps": $STEPS}, "peer_tokens_per_s": round(p), "cpp_tokens_per_s": round(c),
                  "ratio": round(c / p, 3), "peer_max_rss_mb": round(med(sys.argv[3])),
                  "cpp_max_rss_mb": round(med(sys.argv[4]))}))
PY
done
