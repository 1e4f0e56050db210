#!/usr/bin/env bash
# The CPU step against the machine's matmul roof: the trainer's achieved matmul FLOP/s on the kjv
# config shape (4 layers, d 256, T 128, batch 16, vocab 4096; bytes-tokenized Bible, vocabulary
# padded to 4096), next to the SGEMM FLOP/s measured on the same machine in the same run (LibTorch
# torch.mm of 2048^3 fp32 through /usr/bin/python3, same OpenBLAS, best of 5, before and after the
# trainer) and the trainer's own 1024^3 measurement at start (its CPU MFU denominator).
# Achieved = matmul FLOPs per token (the log's) x real tokens per second of a window: the median
# of the windows of 5 steps after the first (which holds the warm-up step), so that one slow
# stretch of a shared host does not decide the figure. ROUNDS rounds (SGEMM, trainer, SGEMM), each
# against the higher of its two SGEMMs; prints every round's ratio and their median: on a shared
# host the step's speed comes in stretches (seen: 64.9-79.7% of the roof in 18 runs) that a
# 2048^3 product measured next to it does not show.
# Then where the step's time goes: a second run profiles two steps (log.profile_steps) and
# bench/profile_breakdown.py splits them by op (self time: matmuls, GELU, softmax, loss, layer
# norm, copies, other elementwise, time in no op) and gives the matmul kernels' own FLOP/s.
# usage: bench/roofline.sh [--steps N] [--rounds R] [extra trainer overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=40 ROUNDS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --steps) STEPS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) break ;;
  esac
done
[ -x build/bin/trainer ] || bash launch/dev/build.sh trainer prep >&2
WORK=$(mktemp -d /tmp/lmroof.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if command -v bible >/dev/null; then bible -f "Gen1:1-Rev22:21" > "$WORK/corpus.txt"
else for i in $(seq 20000); do echo "in the beginning god created the heaven and the earth $i"; done > "$WORK/corpus.txt"; fi
build/bin/prep "$WORK/corpus.txt" --out "$WORK/data" --tokenizer bytes --quiet >&2
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs" >&2
sgemm() {
  /usr/bin/python3 -c '
import time, torch
n = 2048; a, b = torch.randn(n, n), torch.randn(n, n); c = torch.mm(a, b); best = 1e9
for _ in range(5):
    t = time.perf_counter(); torch.mm(a, b, out=c); best = min(best, time.perf_counter() - t)
print(2 * n ** 3 / best)'
}
SG=""
for r in $(seq "$ROUNDS"); do  # each round: SGEMM, the trainer, SGEMM
  s1=$(sgemm)
  build/bin/trainer configs/kjv.yaml "run.dir=$WORK/run$r" "data.train=$WORK/data" model.vocab_size=4096 \
    "train.max_steps=$STEPS" "log.every_steps=5" eval.batches=0 log.tensorboard=false "$@" > "$WORK/out$r.txt" 2>&1
  SG="$SG $s1 $(sgemm)"
done
P=$((STEPS / 2))
build/bin/trainer configs/kjv.yaml "run.dir=$WORK/prof" "data.train=$WORK/data" model.vocab_size=4096 \
  "train.max_steps=$((P + 2))" "log.every_steps=$((P + 2))" eval.batches=0 log.tensorboard=false \
  "log.profile_steps=$P-$((P + 1))" "$@" > "$WORK/prof.txt" 2>&1
/usr/bin/python3 - "$WORK" "$P" $SG <<'PY'
import glob, json, re, statistics, subprocess, sys
work, p, sg = sys.argv[1], int(sys.argv[2]), [float(x) for x in sys.argv[3:]]
rounds = []
for r in range(len(sg) // 2):
    s1, s2 = sg[2 * r], sg[2 * r + 1]
    out = open("%s/out%d.txt" % (work, r + 1)).read()
    peak = float(re.search(r"MFU against ([0-9.e+]+) TFLOP/s", out).group(1)) * 1e12
    flops_per_token = float(re.search(r"([0-9.e+]+) FLOPs/token", out).group(1))
    recs = [json.loads(l) for l in open("%s/run%d/metrics.jsonl" % (work, r + 1)) if '"kind":"train"' in l][1:]
    rec = sorted(recs, key=lambda x: x["step_ms"])[len(recs) // 2]  # the median window
    achieved = flops_per_token * rec["tokens_per_s"]
    roof = max(s1, s2)
    rounds.append({"trainer_matmul_gflops": round(achieved / 1e9, 1), "sgemm_2048_gflops": round(roof / 1e9, 1),
                   "sgemm_2048_before_after": [round(s1 / 1e9, 1), round(s2 / 1e9, 1)],
                   "trainer_start_sgemm_1024_gflops": round(peak / 1e9, 1),
                   "achieved_over_sgemm_2048": round(achieved / roof, 3), "trainer_mfu_pct_logged": round(rec["mfu_pct"], 1),
                   "step_ms": round(rec["step_ms"], 1), "tokens_per_s": round(rec["tokens_per_s"]),
                   "flops_per_token": flops_per_token})
ratios = [x["achieved_over_sgemm_2048"] for x in rounds]
med = sorted(rounds, key=lambda x: x["achieved_over_sgemm_2048"])[(len(rounds) - 1) // 2]  # the median round (lower)
print(json.dumps({"rounds": len(rounds), "achieved_over_sgemm_2048_per_round": ratios,
                  "achieved_over_sgemm_2048_median": round(statistics.median(ratios), 3),
                  "median_round": {k: v for k, v in med.items() if k != "flops_per_token"}}))
flops_per_token, rec = med["flops_per_token"], med
roof = med["sgemm_2048_gflops"] * 1e9
tokens_per_step = rec["tokens_per_s"] * rec["step_ms"] / 1e3
trace = glob.glob(work + "/prof/profile/*.trace.json")[0]
print(subprocess.run(["/usr/bin/python3", "bench/profile_breakdown.py", trace, "2", str(rec["step_ms"]),
                      str(flops_per_token * tokens_per_step), str(roof)], check=True, capture_output=True, text=True).stdout.strip())
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
