#!/usr/bin/env bash
# The GPU check, ONE device run (shared/GPU.md): build against pip LibTorch 2.x + CUDA, a
# correctness smoke (a few steps, save, resume, loss finite and falling, resumed curve within a
# tolerance of the uninterrupted one), then GPT-2 124M (micro-batch 16 x 1024, bf16) trained from
# real shards through the streaming loader, and the PyTorch peer (shared/peers/gpt_torch.py) in
# eager and --compile modes on the same shape, in the same run. Results as JSON under $OUT.
# usage (on the GPU machine, after launch/gpu-deps.sh ran here):  bash bench/gpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
STEPS=${STEPS:-60}
log() { echo "== $*" | tee -a "$OUT/gpu.log"; }
log "build"
NINJA_JOBS=16 bash launch/gpu-build.sh > "$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
export LD_LIBRARY_PATH="${DEPS:-/opt/deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
B=build-gpu/bin
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
log "data: the King James Bible, bytes tokenizer (the 124M shape pads vocab_size 50257 to 50304)"
$B/prep .deps/kjv.txt --out shards/kjv_bytes --tokenizer bytes --quiet
log "tests that need no CPU-only assumptions"
$B/tensorboard_tests --gtest_filter='*Python*' > "$OUT/tensorboard_tests.log" 2>&1 || true
log "smoke: 40 steps, checkpoint every 10, killed at 25, resumed"
common=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes log.every_steps=1 eval.batches=0 train.max_steps=40
        checkpoint.every_steps=10 schedule.warmup_steps=10 model.n_layer=4)
rm -rf runs/gpu_smoke_a runs/gpu_smoke_b
$B/trainer "${common[@]}" run.dir=runs/gpu_smoke_a > "$OUT/smoke_a.log" 2>&1
$B/trainer "${common[@]}" run.dir=runs/gpu_smoke_b train.max_steps=25 checkpoint.every_steps=10 > "$OUT/smoke_b1.log" 2>&1
$B/trainer "${common[@]}" run.dir=runs/gpu_smoke_b > "$OUT/smoke_b2.log" 2>&1
python3 - runs/gpu_smoke_a runs/gpu_smoke_b > "$OUT/smoke.json" <<'PY'
import json, math, sys
def losses(d): return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if r.get("kind") == "train"}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
after = [s for s in a if s > 20 and s in b]
dev = max(abs(a[s] - b[s]) / a[s] for s in after)
first, last = sum(a[s] for s in range(1, 6)) / 5, sum(a[s] for s in range(36, 41)) / 5
print(json.dumps({"finite": all(math.isfinite(v) for v in a.values()), "falling": last < first, "first5": first,
                  "last5": last, "resume_max_rel_dev": dev, "resume_within_2pct": dev < 0.02}))
PY
cat "$OUT/smoke.json"
log "throughput: trainer, GPT-2 124M, 16 x 1024, bf16, $STEPS steps"
rm -rf runs/gpu_124m
$B/trainer configs/gpt2-124m.yaml data.train=shards/kjv_bytes run.dir=runs/gpu_124m train.max_steps=$STEPS \
  log.every_steps=10 eval.batches=0 checkpoint.every_steps=0 > "$OUT/trainer.log" 2>&1
cp runs/gpu_124m/metrics.jsonl runs/gpu_124m/summary.json runs/gpu_124m/meta.json "$OUT/" || true
log "peer: eager and compile"
PEER=shared/peers/gpt_torch.py; [ -f "$PEER" ] || PEER=../shared/peers/gpt_torch.py
python3 "$PEER" --steps 30 --warmup 10 > "$OUT/peer_eager.json" 2> "$OUT/peer_eager.err"
python3 "$PEER" --steps 30 --warmup 10 --compile > "$OUT/peer_compile.json" 2> "$OUT/peer_compile.err"
python3 - "$OUT" <<'PY' | tee "$OUT/result.json"
import json, sys
o = sys.argv[1]
s = json.load(open(o + "/summary.json"))
recs = [r for r in map(json.loads, open(o + "/metrics.jsonl")) if r.get("kind") == "train"][1:]
tps = sum(r["tokens_per_s"] for r in recs) / len(recs)
mfu = [r["mfu_pct"] for r in recs if r.get("mfu_pct") is not None]
wait = sum(r["data_wait_pct"] for r in recs) / len(recs)
e = json.loads(open(o + "/peer_eager.json").read().strip().splitlines()[-1])
c = json.loads(open(o + "/peer_compile.json").read().strip().splitlines()[-1])
print(json.dumps({"trainer_tokens_per_s": round(tps), "trainer_mfu_pct": round(sum(mfu) / len(mfu), 1) if mfu else None,
                  "trainer_data_wait_pct": round(wait, 3), "peer_eager_tokens_per_s": e["tokens_per_s"],
                  "peer_compile_tokens_per_s": c["tokens_per_s"], "vs_eager": round(tps / e["tokens_per_s"], 3),
                  "vs_compile": round(tps / c["tokens_per_s"], 3), "peer_eager_mfu_pct": e["mfu_pct"],
                  "peer_compile_mfu_pct": c["mfu_pct"]}))
PY
