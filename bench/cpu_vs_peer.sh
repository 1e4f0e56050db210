#!/usr/bin/env bash
# C++ trainer vs the Python peer (bench/peers/gpt_torch.py, PyTorch with $PYTHON) on the same work,
# on CPU, in one run: same model (shape, init, tied head), batch, precision (fp32), thread count,
# AdamW (betas, eps, weight-decay groups: Linear matrices decayed; biases, norms, embeddings not)
# and gradient clipping (optim.grad_clip / --grad-clip, default 1.0; 0 turns it off on both sides).
# The peer is the repository's own copy, never a file from outside it. The peer trains on random
# ids; the trainer on real shards through its reader (same shapes, so the same FLOPs).
#
# The peer runs in every configuration this machine allows, and the trainer's ratio is reported
# against the FASTEST of them ("strongest", by median), not against a chosen one:
#   eager           glibc malloc as it comes
#   eager+glibc     glibc tuned to keep activations mapped (MALLOC_MMAP_THRESHOLD_=32 MB, its maximum,
#                   MALLOC_TRIM_THRESHOLD_=16 GB: freed memory stays in the heap instead of being
#                   unmapped and page-faulted again each step; the trainer's caching host allocator
#                   does the same)
#   eager+jemalloc  LD_PRELOAD libjemalloc.so.2 (Debian libjemalloc2), never purging
#                   (MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1)
#   eager+tcmalloc  LD_PRELOAD libtcmalloc_minimal.so.4 (Debian libtcmalloc-minimal4), never releasing
#                   (TCMALLOC_RELEASE_RATE=0)
#   compile+ALLOC   torch.compile (inductor, CPU) under ALLOC (env COMPILE_ALLOC; default the first of
#                   jemalloc, tcmalloc, glibc found); only on torch 2.x
# Each runs AdamW through the fastest implementation its torch has (--adamw auto: the fused CPU
# kernel from 2.4, else foreach) and the multi-tensor clip norm where clip_grad_norm_ has it (2.x).
# An allocator that is not installed is left out (said on stderr).
# Rounds alternate all peer configurations and the trainer, so drift hits all; medians are reported.
# With --profile DIR, after the rounds: the trainer profiles steps 3-5 (log.profile_steps) and the
# strongest peer, and the fastest eager peer when the compiled one is strongest, 3 steps (--trace),
# and bench/profile_breakdown.py --compare sets them side by side (DIR/compare.json, DIR/compare.txt).
#
# usage: bench/cpu_vs_peer.sh [--threads N] [--rounds R] [--steps S] [--layers L --heads H --dim D
#                              --seq T --batch B --vocab V] [--grad-clip C] [--profile DIR]
# env: PYTHON (/usr/bin/python3), BUILD_DIR (build), COMPILE (auto: when the peer's torch is 2.x; 0, 1),
#      PEERS (the configurations, default all of the above), COMPILE_ALLOC
# Prints one JSON line: {"peers": {CONFIG: {"tokens_per_s", "rounds"}}, "cpp_tokens_per_s",
#   "strongest_peer", "ratio_vs_strongest", "ratios": {CONFIG: ratio}, "machine", "load_before",
#   "load_after", "date", ...}
set -euo pipefail
cd "$(dirname "$0")/.."
THREADS=1 ROUNDS=3 STEPS=20 LAYERS=4 HEADS=4 DIM=256 SEQ=256 BATCH=8 VOCAB=4096 CLIP=1.0 PROFILE=
while [ $# -gt 0 ]; do
  case "$1" in
    --threads) THREADS=$2 ;; --rounds) ROUNDS=$2 ;; --steps) STEPS=$2 ;; --layers) LAYERS=$2 ;;
    --heads) HEADS=$2 ;; --dim) DIM=$2 ;; --seq) SEQ=$2 ;; --batch) BATCH=$2 ;; --vocab) VOCAB=$2 ;;
    --grad-clip) CLIP=$2 ;; --profile) PROFILE=$2 ;;
    *) echo "cpu_vs_peer.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
PEER=bench/peers/gpt_torch.py  # in the repository (the shell is in its root)
[ -f "$PEER" ] || { echo "cpu_vs_peer.sh: $PEER missing" >&2; exit 2; }
PY=${PYTHON:-/usr/bin/python3}
B=${BUILD_DIR:-build}/bin
[ -x "$B/trainer" ] || bash launch/dev/build.sh trainer prep >&2
COMPILE=${COMPILE:-auto}
if [ "$COMPILE" = auto ]; then
  COMPILE=$("$PY" -c 'import torch; print(int(int(torch.__version__.split(".")[0]) >= 2))')
fi
# The allocators, where Debian installed them.
lib() { local f; for f in /usr/lib/*-linux-gnu/"$1" /usr/lib/"$1"; do [ -e "$f" ] && { echo "$f"; return; }; done; true; }
JEMALLOC=$(lib libjemalloc.so.2) TCMALLOC=$(lib libtcmalloc_minimal.so.4)
alloc_env() {  # alloc_env NAME: the env words that select allocator NAME
  case "$1" in
    libc) echo "" ;;
    glibc) echo "MALLOC_MMAP_THRESHOLD_=33554432 MALLOC_TRIM_THRESHOLD_=17179869184" ;;
    jemalloc) echo "LD_PRELOAD=$JEMALLOC MALLOC_CONF=dirty_decay_ms:-1,muzzy_decay_ms:-1" ;;
    tcmalloc) echo "LD_PRELOAD=$TCMALLOC TCMALLOC_RELEASE_RATE=0" ;;
  esac
}
have_alloc() { case "$1" in jemalloc) [ -n "$JEMALLOC" ] ;; tcmalloc) [ -n "$TCMALLOC" ] ;; *) true ;; esac; }
if [ -z "${COMPILE_ALLOC:-}" ]; then
  COMPILE_ALLOC=glibc
  for a in tcmalloc jemalloc; do have_alloc $a && COMPILE_ALLOC=$a; done
fi
CONFIGS=()
for c in ${PEERS:-eager eager+glibc eager+jemalloc eager+tcmalloc compile+$COMPILE_ALLOC}; do
  mode=${c%%+*} alloc=${c#*+}; [ "$alloc" = "$c" ] && alloc=libc
  if [ "$mode" = compile ] && [ "$COMPILE" != 1 ]; then continue; fi
  have_alloc "$alloc" || { echo "cpu_vs_peer.sh: $alloc not installed, peer $c left out" >&2; continue; }
  CONFIGS+=("$c")
done

WORK=$(mktemp -d /tmp/lmbench.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# Real shards (bytes tokenizer); model.vocab_size pads the vocabulary to the peer's.
if command -v bible >/dev/null; then bible -f "Gen1:1-Rev22:21" > "$WORK/corpus.txt"
else for i in $(seq 20000); do echo "in the beginning god created the heaven and the earth $i"; done > "$WORK/corpus.txt"; fi
"$B/prep" "$WORK/corpus.txt" --out "$WORK/data" --tokenizer bytes --quiet >&2

CPUS=$(nproc)  # before OMP_NUM_THREADS, which nproc obeys
export OMP_NUM_THREADS=$THREADS
MODEL=$(sed -n 's/^Model name: *//p' <(LC_ALL=C lscpu) | head -1)
FLAGS=$(grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
FAMILY=$(sed -n 's/^CPU family: *//p' <(LC_ALL=C lscpu) | head -1)
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
TORCH=$("$PY" -c 'import torch; print(torch.__version__)')
echo "machine: $MODEL (family $FAMILY), $CPUS CPUs, $FLAGS; load before: $LOAD_BEFORE; peer torch $TORCH; $(date -u +%FT%TZ)" >&2
echo "peers: ${CONFIGS[*]}" >&2

# run_peer CONFIG [ARGS...]: the peer's JSON line in CONFIG (the compiled peer warms up longer:
# inductor compiles during its first steps, which the timing leaves out).
run_peer() {
  local c=$1; shift
  local mode=${c%%+*} alloc=${c#*+} flags=(--warmup 2)
  [ "$alloc" = "$c" ] && alloc=libc
  [ "$mode" = compile ] && flags=(--warmup 4 --compile)
  # shellcheck disable=SC2046  # alloc_env's words are NAME=VALUE pairs without spaces
  env $(alloc_env "$alloc") "$PY" "$PEER" --device cpu --dtype fp32 --threads "$THREADS" --layers "$LAYERS" \
    --grad-clip "$CLIP" --heads "$HEADS" --dim "$DIM" --seq "$SEQ" --batch "$BATCH" --vocab "$VOCAB" \
    --steps "$STEPS" "${flags[@]}" "$@" | tail -n 1
}
run_cpp() {  # run_cpp DIR MAX_STEPS [OVERRIDES...]
  local dir=$1 n=$2; shift 2
  "$B/trainer" configs/tiny.yaml "run.dir=$dir" "data.train=$WORK/data" \
      "model.n_layer=$LAYERS" "model.n_head=$HEADS" "model.d_model=$DIM" "model.seq_len=$SEQ" \
      "model.vocab_size=$VOCAB" "train.micro_batch_size=$BATCH" "train.threads=$THREADS" \
      "train.max_steps=$n" "eval.batches=0" "log.tensorboard=false" "optim.grad_clip=$CLIP" "$@" >"$dir.log" 2>&1 ||
    { tail -5 "$dir.log" >&2; echo "cpu_vs_peer.sh: the trainer failed (log above)" >&2; exit 1; }
}
: > "$WORK/peer.jsonl"
# The same model on both sides: the trainer's parameter count and first-step loss (one step), beside
# the peer's (its JSON line: params, first_loss).
run_cpp "$WORK/check" 1 "log.every_steps=1"
cpp=()
for r in $(seq "$ROUNDS"); do
  line="round $r:"
  for c in "${CONFIGS[@]}"; do
    j=$(run_peer "$c")
    echo "$c $j" >> "$WORK/peer.jsonl"
    line+=" $c $("$PY" -c 'import json,sys; print(json.loads(sys.argv[1])["tokens_per_s"])' "$j"),"
  done
  # summary.json tokens_per_s excludes the first step (warm-up).
  run_cpp "$WORK/run$r" $((STEPS + 2)) "log.every_steps=$((STEPS + 2))"
  cpp+=("$("$PY" -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["tokens_per_s"]))' "$WORK/run$r/summary.json")")
  echo "$line c++ ${cpp[-1]} tok/s" >&2
done
LOAD_AFTER=$(cut -d' ' -f1-3 /proc/loadavg)
echo "load after: $LOAD_AFTER" >&2
CPP_FIRST_LOSS=$("$PY" -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline()).get("loss"))' "$WORK/check/metrics.jsonl")
CPP_PARAMS=$(grep -o -E '[0-9]+ param' "$WORK/check.log" | head -1 | cut -d' ' -f1 || true)
"$PY" - "$WORK/peer.jsonl" "${cpp[*]}" > "$WORK/result.json" <<PY
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    c, j = line.split(" ", 1); runs[c].append(json.loads(j))
cpp = [float(x) for x in sys.argv[2].split()]
c = statistics.median(cpp)
peers = {k: {"tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in v)),
             "rounds": [r["tokens_per_s"] for r in v], "adamw": v[0]["adamw"], "params": v[0]["params"],
             "params_decayed": v[0]["params_decayed"], "first_loss": v[0]["first_loss"]} for k, v in runs.items()}
best = max(peers, key=lambda k: peers[k]["tokens_per_s"])
print(json.dumps({
    "shape": {"layers": $LAYERS, "heads": $HEADS, "dim": $DIM, "seq": $SEQ, "batch": $BATCH, "vocab": $VOCAB,
              "dtype": "fp32", "threads": $THREADS, "steps": $STEPS, "grad_clip_both_sides": $CLIP},
    "peer": "$PEER", "peer_torch": "$TORCH",
    "machine": {"cpu": "$MODEL", "family": "$FAMILY", "cpus": $CPUS, "flags": "$FLAGS".split()},
    "load_before": "$LOAD_BEFORE", "load_after": "$LOAD_AFTER", "date": "$(date -u +%FT%TZ)",
    "peers": peers, "cpp_tokens_per_s": round(c), "cpp_rounds": cpp, "cpp_first_loss": $CPP_FIRST_LOSS,
    "cpp_params": ${CPP_PARAMS:-None},
    "strongest_peer": best, "ratio_vs_strongest": round(c / peers[best]["tokens_per_s"], 3),
    "ratios": {k: round(c / v["tokens_per_s"], 3) for k, v in peers.items()}}))
PY
if [ -n "$PROFILE" ]; then
  mkdir -p "$PROFILE"
  best=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["strongest_peer"])' "$WORK/result.json")
  eager=$("$PY" -c 'import json,sys; p=json.load(open(sys.argv[1]))["peers"]
print(max((k for k in p if k.startswith("eager")), key=lambda k: p[k]["tokens_per_s"]))' "$WORK/result.json")
  run_cpp "$WORK/prof" 5 "log.every_steps=5" "log.profile_steps=3-5"
  cp "$WORK/prof/profile/steps_3-5.rank0.trace.json" "$PROFILE/trainer.trace.json"
  cp "$WORK/prof/profile/steps_3-5.rank0.top.json" "$PROFILE/trainer.top.json"
  args=()
  for c in $(printf '%s\n' "$best" "$eager" | sort -u); do
    run_peer "$c" --trace "$WORK/trace-$c" > /dev/null
    stem=$(ls "$WORK/trace-$c"/*.trace.json); stem=${stem%.trace.json}
    cp "$stem.trace.json" "$PROFILE/peer-$c.trace.json"; cp "$stem.top.json" "$PROFILE/peer-$c.top.json"
    args+=("$c=$PROFILE/peer-$c.trace.json")
  done
  # The step times without the profiler: the medians above.
  "$PY" bench/profile_breakdown.py --compare --result "$WORK/result.json" \
    "trainer=$PROFILE/trainer.trace.json" "${args[@]}" --table "$PROFILE/compare.txt" > "$PROFILE/compare.json"
  cp "$WORK/result.json" "$PROFILE/result.json"
  cat "$PROFILE/compare.txt" >&2
fi
cat "$WORK/result.json"
