#!/usr/bin/env bash
# The CPU step against the machine's matmul roof: the trainer's achieved matmul FLOP/s on the kjv
# config shape (4 layers, d 256, T 128, batch 16, vocab 4096; bytes-tokenized Bible, vocabulary
# padded to 4096), next to the SGEMM FLOP/s measured on the same machine in the same run (LibTorch
# torch.mm of 2048^3 fp32 through /usr/bin/python3, same OpenBLAS, best of 5, before and after the
# trainer) and the trainer's own 1024^3 measurement at start (its CPU MFU denominator).
# Achieved = matmul FLOPs per token (the log's) x real tokens per second of a window: the median
# of the windows of 5 steps after the first (which holds the warm-up step), so that one slow
# stretch of a shared host does not decide the figure.
# Then where the step's time goes: a second run profiles two steps (log.profile_steps) and
# bench/profile_breakdown.py splits them by op (self time: matmuls, GELU, softmax, loss, layer
# norm, copies, other elementwise, time in no op) and gives the matmul kernels' own FLOP/s.
# usage: bench/roofline.sh [--steps N] [extra trainer overrides...]
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=40
[ "${1:-}" = "--steps" ] && { STEPS=$2; shift 2; }
[ -x build/bin/trainer ] || bash launch/build.sh trainer prep >&2
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
s1=$(sgemm)
build/bin/trainer configs/kjv.yaml "run.dir=$WORK/run" "data.train=$WORK/data" model.vocab_size=4096 \
  "train.max_steps=$STEPS" "log.every_steps=5" eval.batches=0 log.tensorboard=false "$@" > "$WORK/out.txt" 2>&1
s2=$(sgemm)
P=$((STEPS / 2))
build/bin/trainer configs/kjv.yaml "run.dir=$WORK/prof" "data.train=$WORK/data" model.vocab_size=4096 \
  "train.max_steps=$((P + 2))" "log.every_steps=$((P + 2))" eval.batches=0 log.tensorboard=false \
  "log.profile_steps=$P-$((P + 1))" "$@" > "$WORK/prof.txt" 2>&1
/usr/bin/python3 - "$WORK" "$s1" "$s2" "$P" <<'PY'
import glob, json, re, subprocess, sys
work, s1, s2, p = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
out = open(work + "/out.txt").read()
peak = float(re.search(r"MFU against ([0-9.e+]+) TFLOP/s", out).group(1)) * 1e12
flops_per_token = float(re.search(r"([0-9.e+]+) FLOPs/token", out).group(1))
recs = [json.loads(l) for l in open(work + "/run/metrics.jsonl") if '"kind":"train"' in l][1:]
rec = sorted(recs, key=lambda r: r["step_ms"])[len(recs) // 2]  # the median window
achieved = flops_per_token * rec["tokens_per_s"]
roof = max(s1, s2)
print(json.dumps({"trainer_matmul_gflops": round(achieved / 1e9, 1), "sgemm_2048_gflops": round(roof / 1e9, 1),
                  "sgemm_2048_before_after": [round(s1 / 1e9, 1), round(s2 / 1e9, 1)],
                  "trainer_start_sgemm_1024_gflops": round(peak / 1e9, 1),
                  "achieved_over_sgemm_2048": round(achieved / roof, 3), "trainer_mfu_pct_logged": round(rec["mfu_pct"], 1),
                  "step_ms": rec["step_ms"], "tokens_per_s": rec["tokens_per_s"]}))
tokens_per_step = rec["tokens_per_s"] * rec["step_ms"] / 1e3
trace = glob.glob(work + "/prof/profile/*.trace.json")[0]
print(subprocess.run(["/usr/bin/python3", "bench/profile_breakdown.py", trace, "2", str(rec["step_ms"]),
                      str(flops_per_token * tokens_per_step), str(roof)], check=True, capture_output=True, text=True).stdout.strip())
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
