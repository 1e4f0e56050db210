#!/usr/bin/env bash
# C++ trainer vs the Python peer (bench/peers/gpt_torch.py, PyTorch with /usr/bin/python3) on the
# same work: same model shape, batch, precision (fp32), thread count and gradient clipping (the
# global norm clipped to --grad-clip, default 1.0 as the trainer's configs, set on both sides
# explicitly: optim.grad_clip for the trainer, --grad-clip for the peer; 0 turns it off on both), on
# CPU, in one run. The peer is the repository's own copy (bench/peers/gpt_torch.py), never a file
# from outside it. Where the peer's PyTorch is 2.x (launch/torch2.sh peer:
# Debian 13's 2.6) the peer also runs under torch.compile (inductor, CPU), the strongest peer.
# The peer trains on random ids; the trainer on real shards through its reader (same shapes, so
# the same FLOPs). Rounds alternate peer/tuned peer/trainer so drift hits all; the median of each is
# reported. The tuned peer runs with glibc malloc tuned as a user would to keep activations mapped
# (MALLOC_MMAP_THRESHOLD_=32 MB, glibc's maximum, and MALLOC_TRIM_THRESHOLD_=16 GB: freed memory
# stays in the heap instead of being unmapped and page-faulted again each step), since part of our
# margin is the trainer's caching host allocator doing exactly that.
#
# usage: bench/cpu_vs_peer.sh [--threads N] [--rounds R] [--steps S] [--layers L --heads H --dim D
#                              --seq T --batch B --vocab V] [--grad-clip C]
# env: PYTHON (/usr/bin/python3), BUILD_DIR (build), COMPILE (auto: when the peer's torch is 2.x; 0, 1)
# Prints one JSON line: {"peer_tokens_per_s":..., "peer_tuned_tokens_per_s":..., "cpp_tokens_per_s":...,
#                        "ratio":..., "ratio_vs_tuned_peer":..., ["peer_compile_tokens_per_s":...,
#                        "ratio_vs_compile":...], ...}
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=1 ROUNDS=3 STEPS=20 LAYERS=4 HEADS=4 DIM=256 SEQ=256 BATCH=8 VOCAB=4096 CLIP=1.0
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2 ;; --rounds) ROUNDS=$2 ;; --steps) STEPS=$2 ;; --layers) LAYERS=$2 ;;
    --heads) HEADS=$2 ;; --dim) DIM=$2 ;; --seq) SEQ=$2 ;; --batch) BATCH=$2 ;; --vocab) VOCAB=$2 ;;
    --grad-clip) CLIP=$2 ;;
    *) echo "cpu_vs_peer.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
PEER=bench/peers/gpt_torch.py  # in the repository (the shell is in its root)
[ -f "$PEER" ] || { echo "cpu_vs_peer.sh: $PEER missing" >&2; exit 2; }
PY=${PYTHON:-/usr/bin/python3}
B=${BUILD_DIR:-build}/bin
[ -x "$B/trainer" ] || bash launch/build.sh >&2
COMPILE=${COMPILE:-auto}
if [ "$COMPILE" = auto ]; then
  COMPILE=$("$PY" -c 'import torch; print(int(int(torch.__version__.split(".")[0]) >= 2))')
fi
WORK=$(mktemp -d /tmp/lmbench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# Real shards (bytes tokenizer); model.vocab_size pads the vocabulary to the peer's.
if command -v bible >/dev/null; then bible -f "Gen1:1-Rev22:21" > "$WORK/corpus.txt"
else for i in $(seq 20000); do echo "in the beginning god created the heaven and the earth $i"; done > "$WORK/corpus.txt"; fi
"$B/prep" "$WORK/corpus.txt" --out "$WORK/data" --tokenizer bytes --quiet >&2

CPUS=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OMP_NUM_THREADS=$THREADS
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $CPUS CPUs; peer: $("$PY" -c 'import torch; print("torch", torch.__version__)')" >&2
peer=() tuned=() cpp=() compiled=()
# run_peer [--compile] ENV...: the peer's tokens/s (the compiled peer warms up longer: inductor
# compiles during its first steps, which the timing leaves out).
run_peer() {
  local flags=(--warmup 2)
  [ "$1" = --compile ] && { flags=(--warmup 4 --compile); shift; }
  "$@" "$PY" "$PEER" --device cpu --dtype fp32 --threads "$THREADS" --layers "$LAYERS" --grad-clip "$CLIP" \
    --heads "$HEADS" --dim "$DIM" --seq "$SEQ" --batch "$BATCH" --vocab "$VOCAB" --steps "$STEPS" "${flags[@]}" |
    tail -n 1 | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["tokens_per_s"])'
}
for r in $(seq "$ROUNDS"); do
  peer+=("$(run_peer env)")
  tuned+=("$(run_peer env MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184)")
  [ "$COMPILE" = 1 ] && compiled+=("$(run_peer --compile env)")
  "$B/trainer" configs/tiny.yaml "run.dir=$WORK/run$r" "data.train=$WORK/data" \
      "model.n_layer=$LAYERS" "model.n_head=$HEADS" "model.d_model=$DIM" "model.seq_len=$SEQ" \
      "model.vocab_size=$VOCAB" "train.micro_batch_size=$BATCH" "train.threads=$THREADS" \
      "train.max_steps=$((STEPS + 2))" "log.every_steps=$((STEPS + 2))" "eval.batches=0" \
      "log.tensorboard=false" "optim.grad_clip=$CLIP" >/dev/null 2>&1
  # summary.json tokens_per_s excludes the first step (warm-up).
  cpp+=("$("$PY" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$WORK/run$r/summary.json")")
  echo "round $r: peer ${peer[-1]} tok/s, tuned peer ${tuned[-1]} tok/s${compiled:+, compiled peer ${compiled[-1]} tok/s}, c++ ${cpp[-1]} tok/s" >&2
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$PY" - "${peer[*]}" "${cpp[*]}" "${tuned[*]}" "${compiled[*]}" <<PY
import json, statistics, sys, torch
peer = [float(x) for x in sys.argv[1].split()]; cpp = [float(x) for x in sys.argv[2].split()]
tuned = [float(x) for x in sys.argv[3].split()]; comp = [float(x) for x in sys.argv[4].split()]
p, c, t = statistics.median(peer), statistics.median(cpp), statistics.median(tuned)
out = {"shape": {"layers": $LAYERS, "heads": $HEADS, "dim": $DIM, "seq": $SEQ, "batch": $BATCH,
                 "vocab": $VOCAB, "dtype": "fp32", "threads": $THREADS, "steps": $STEPS,
                 "grad_clip_both_sides": $CLIP},
       "peer": "$PEER",
       "peer_torch": torch.__version__,
       "peer_tokens_per_s": round(p), "peer_tuned_tokens_per_s": round(t), "cpp_tokens_per_s": round(c),
       "ratio": round(c / p, 3), "ratio_vs_tuned_peer": round(c / t, 3),
       "peer_rounds": peer, "peer_tuned_rounds": tuned, "cpp_rounds": cpp}
if comp:
    k = statistics.median(comp)
    out.update({"peer_compile_tokens_per_s": round(k), "ratio_vs_compile": round(c / k, 3), "peer_compile_rounds": comp})
print(json.dumps(out))
PY
