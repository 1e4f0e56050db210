#!/usr/bin/env bash
# The GPU check, ONE device run of at most 10 minutes. Phases, each under a time limit, the most
# informative first (a run cut short by the limit still has them):
#   build    trainer + prep only against pip LibTorch 2.x + CUDA (launch/gpu-build.sh; every
#            compile error of the run shown, ninja -k 0)
#   A/B      GPT-2 124M (micro-batch 16 x 1024, bf16) from real shards through the streaming loader,
#            $STEPS steps per variant, the first window (start-up) left out of each mean:
#              all_on    every switch of the GPU step on (train.fused_loss, optim.free_grads,
#                        optim.clip_in_step): the candidate defaults
#              all_off   today's step (each switch off)
#              no_<sw>   all_on with one switch off (what that switch alone is worth)
#              residual  all_on + train.bf16_residual=true (numerics differ: see parity)
#              act_ckpt  all_on + train.activation_checkpointing=block (peak memory vs tokens/s)
#            and the peer (bench/peers/gpt_torch.py, same shape) in eager and torch.compile mode,
#            interleaved so that the first minutes already hold all_on vs both peers
#   traces   Kineto traces (log.profile_steps) of all_on and all_off, and torch.profiler traces of
#            the peer (eager, compile): RUN/profile/*.trace.json + *.top.json (top kernels by GPU time)
#   parity   train.bf16_residual on vs off, 4 layers at the 124M width, 300 steps: the loss curves
#   smoke    4 layers, 40 steps: loss finite and falling; a run stopped at 25 and resumed follows the
#            uninterrupted one; step results read one step late follow a run that reads them at once;
#            one rank with an NCCL process group (dist.backend=nccl at world size 1); and
#            train.activation_checkpointing block vs none with dropout, 10 steps (reported: bit-identical?)
#   tests    trainer_tests' and models_tests' CUDA cases and the TensorBoard Python cross-check
# Every result lands in $OUT/gpu_results.tar.gz (written to a temporary name and renamed after each
# phase, so a run cut short still returns a whole archive); result.json sums it up (tokens/s per
# variant, each switch's worth, ratios to the peer, top kernels side by side, the defaults the
# numbers pick) and is printed. Exit 1 when the build or the smoke failed.
# usage (on the GPU machine; launch/gpu-deps.sh ran here first and .deps/ is carried):
#   bash bench/gpu.sh          env: STEPS (50), BUDGET_S (570), GPU_TESTS (1)
# A dry run of the script's own logic on a CPU (tiny shapes, no build, no tests; the LibTorch 2.6
# environment has every switch and torch.compile):
#   bash launch/torch2.sh shell env GPU_DRY=1 BIN=build-torch2/bin KJV=/tmp/kjv.txt bash bench/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
R=$(mktemp -d /tmp/gpu_results.XXXX)  # results before packing
STEPS=${STEPS:-50}
BUDGET_S=${BUDGET_S:-570}
T0=$(date +%s)
mkdir -p "$OUT"
log() { echo "== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$R/gpu.log"; }
pack() { tar -czf "$OUT/.gpu_results.tar.gz.tmp" -C "$R" . 2>/dev/null && mv -f "$OUT/.gpu_results.tar.gz.tmp" "$OUT/gpu_results.tar.gz"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
# run LIMIT_S NAME CMD...: the command's output in $R/NAME.log; its exit status (124: out of time).
run() {
  local limit=$1 name=$2; shift 2
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  [ "$limit" -le 5 ] && { log "$name: skipped, no time left"; return 124; }
  timeout "$limit" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc"
  return $rc
}
export LD_LIBRARY_PATH="${DEPS:-/opt/deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
B=build-gpu/bin
KJV=${KJV:-.deps/kjv.txt}
SHAPE=() PSHAPE=()  # extra trainer overrides / peer arguments (the dry run's tiny shapes)
export BACKEND=nccl  # the smoke's process group at world size 1
if [ "${GPU_DRY:-0}" = 1 ]; then
  B=${BIN:-build/bin} GPU_TESTS=0
  SHAPE=(train.device=cpu model.n_layer=2 model.d_model=64 model.n_head=2 model.seq_len=64 train.micro_batch_size=2
         optim.fused=on)  # the fused AdamW, which the switches need, is auto on CUDA only
  BACKEND=gloo
  PSHAPE=(--device cpu --layers 2 --dim 64 --heads 2 --seq 64 --vocab 320 --batch 2)
fi

if [ "${GPU_DRY:-0}" = 1 ]; then log "dry run: $B, tiny shapes on the CPU"; else
log "build (trainer, prep)"
nvidia-smi > "$R/nvidia-smi.txt" 2>&1
build() { run 300 build env NINJA_JOBS=16 LM_BUILD_TESTS="$1" TARGETS="trainer prep" bash launch/gpu-build.sh; }
if ! build "$([ "${GPU_TESTS:-1}" = 1 ] && echo ON || echo OFF)"; then
  built=0
  if [ "${GPU_TESTS:-1}" = 1 ] && grep -q "Configuring incomplete" "$R/build.log"; then
    # The tests' configuration failed there (GoogleTest?): build without them rather than lose the run.
    GPU_TESTS=0; rm -rf build-gpu; mv "$R/build.log" "$R/build_with_tests.log"
    build OFF && built=1
  fi
  [ $built = 1 ] || { grep -m 40 -E "error|FAILED" "$R/build.log"; tail -15 "$R/build.log"; pack; exit 1; }
fi
fi
pack

log "data: the King James Bible, bytes tokenizer (the 124M shape pads vocab_size 50257 to 50304)"
rm -rf shards/kjv_bytes
run 60 prep $B/prep "$KJV" --out shards/kjv_bytes --tokenizer bytes --quiet

# The switches of the GPU step (issue 28); each variant names all of them, so a default never decides.
ALL_ON=(train.fused_loss=on optim.free_grads=on optim.clip_in_step=on)
ALL_OFF=(train.fused_loss=off optim.free_grads=off optim.clip_in_step=off)
speed=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes log.every_steps=10 eval.batches=0
       checkpoint.every_steps=0 checkpoint.keep_last=1)
# trainer NAME LIMIT OVERRIDES...: one 124M run; its records (and profile/, if any) as $R/NAME_*.
trainer() {
  local name=$1 limit=$2; shift 2
  rm -rf "runs/gpu_$name"
  run "$limit" "trainer_$name" $B/trainer "${speed[@]}" train.max_steps=$STEPS "$@" "${SHAPE[@]}" run.dir="runs/gpu_$name"
  for f in metrics.jsonl summary.json meta.json; do cp "runs/gpu_$name/$f" "$R/${name}_$f" 2>/dev/null; done
  [ -d "runs/gpu_$name/profile" ] && mkdir -p "$R/traces" &&
    for f in "runs/gpu_$name"/profile/*; do cp "$f" "$R/traces/trainer_${name}.${f##*.rank0.}"; done
  rm -rf "runs/gpu_$name"
  pack
}
PEER=bench/peers/gpt_torch.py
peer() {  # peer NAME LIMIT ARGS...
  local name=$1 limit=$2; shift 2
  run "$limit" "$name" python3 $PEER --steps 30 --warmup 10 --grad-clip 1.0 "$@" "${PSHAPE[@]}"
  pack
}

log "A/B: all switches on; the peer in eager mode; all off (today's step); the peer compiled"
trainer all_on 90 "${ALL_ON[@]}"
peer peer_eager 90
trainer all_off 90 "${ALL_OFF[@]}"
mkdir -p "$R/traces"
peer peer_compile 180 --compile --trace "$R/traces"

log "traces: Kineto of all_on and all_off (steps 21-23), torch.profiler of the peer in eager mode"
STEPS=25 trainer trace_all_on 90 "${ALL_ON[@]}" log.profile_steps=21-23
STEPS=25 trainer trace_all_off 90 "${ALL_OFF[@]}" log.profile_steps=21-23
peer peer_eager_trace 90 --trace "$R/traces"

log "A/B: each switch off alone; the bf16 residual stream on top; activation checkpointing on top"
trainer no_fused_loss 90 "${ALL_ON[@]}" train.fused_loss=off
trainer no_free_grads 90 "${ALL_ON[@]}" optim.free_grads=off
trainer no_clip_in_step 90 "${ALL_ON[@]}" optim.clip_in_step=off
trainer residual 90 "${ALL_ON[@]}" train.bf16_residual=true
trainer act_ckpt 90 "${ALL_ON[@]}" train.activation_checkpointing=block  # memory (mem_mb: CUDA peak) vs time

log "parity: train.bf16_residual on vs off, 4 layers, 300 steps (the loss curves)"
parity=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes model.n_layer=4 train.max_steps=300 log.every_steps=25
        eval.batches=0 checkpoint.every_steps=0 checkpoint.keep_last=1 schedule.warmup_steps=30
        schedule.decay_steps=300 "${ALL_ON[@]}")
for res in false true; do
  rm -rf "runs/gpu_parity_$res"
  run 90 "parity_$res" $B/trainer "${parity[@]}" train.bf16_residual=$res "${SHAPE[@]}" run.dir="runs/gpu_parity_$res"
  cp "runs/gpu_parity_$res/metrics.jsonl" "$R/parity_${res}_metrics.jsonl" 2>/dev/null
  rm -rf "runs/gpu_parity_$res"
done
pack

log "smoke: 4 layers, 40 steps; stopped at 25 and resumed; deferred vs immediate step reads"
common=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes model.n_layer=4 train.max_steps=40 log.every_steps=5
        eval.batches=0 checkpoint.every_steps=10 checkpoint.keep_last=1 schedule.warmup_steps=10
        schedule.decay_steps=40)
rm -rf runs/gpu_smoke_*
run 90 smoke_a $B/trainer "${common[@]}" "${SHAPE[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_a
run 90 smoke_b1 $B/trainer "${common[@]}" "${SHAPE[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_b train.max_steps=25
run 90 smoke_b2 $B/trainer "${common[@]}" "${SHAPE[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_b
run 90 smoke_c $B/trainer "${common[@]}" "${SHAPE[@]}" run.dir=runs/gpu_smoke_c
run 90 smoke_nccl $B/trainer "${common[@]}" "${SHAPE[@]}" dist.backend=$BACKEND train.max_steps=10 run.dir=runs/gpu_smoke_n
# Activation checkpointing on the device: block vs none with dropout, 10 steps, every loss (the
# rerun must draw the same masks from the CUDA generator and pick the same kernels: bit-identical).
for ck in none block; do
  run 60 "smoke_ckpt_$ck" $B/trainer "${common[@]}" "${SHAPE[@]}" model.dropout=0.1 train.max_steps=10 log.every_steps=1 \
    checkpoint.every_steps=0 train.activation_checkpointing=$ck run.dir=runs/gpu_smoke_ckpt_$ck
  cp "runs/gpu_smoke_ckpt_$ck/metrics.jsonl" "$R/smoke_ckpt_${ck}_metrics.jsonl" 2>/dev/null
done
for d in a b c; do
  for f in metrics.jsonl summary.json meta.json; do cp "runs/gpu_smoke_$d/$f" "$R/smoke_${d}_$f" 2>/dev/null; done
done
python3 - "$R" > "$R/smoke.json" <<'PY'
import json, math, sys
r = sys.argv[1]
def losses(d):
    try: recs = [json.loads(l) for l in open(f"{r}/smoke_{d}_metrics.jsonl")]
    except OSError: return {}
    return {x["step"]: x["loss"] for x in recs if x.get("kind") == "train"}  # null: a non-finite window
def ok(v): return isinstance(v, (int, float)) and math.isfinite(v)
def grep(name, text):
    try: return text in open(f"{r}/{name}.log").read()
    except OSError: return False
a, b, c = losses("a"), losses("b"), losses("c")
res = {"steps_logged": [len(a), len(b), len(c)], "complete": all(len(x) == 8 for x in (a, b, c))}
res["finite"] = res["complete"] and all(ok(v) for x in (a, b, c) for v in x.values())
if res["finite"]:
    res["first_window"], res["last_window"] = a[5], a[40]
    res["falling"] = a[40] < a[5] - 0.5
    dev = lambda x, y, steps: max(abs(x[s] - y[s]) / abs(x[s]) for s in steps)
    res["resume_max_rel_dev"] = dev(a, b, [30, 35, 40])      # steps run after the resume at 25
    res["deferred_vs_immediate_max_rel_dev"] = dev(a, c, sorted(a))
    res["resume_within_2pct"] = res["resume_max_rel_dev"] < 0.02
    res["deferred_within_2pct"] = res["deferred_vs_immediate_max_rel_dev"] < 0.02
res["deferred_used"] = grep("smoke_a", "one step late") and not grep("smoke_c", "one step late")
res["resumed"] = grep("smoke_b2", "resumed from")
import os
res["nccl_world1"] = grep("smoke_nccl", "data parallel: " + os.environ["BACKEND"]) and grep("smoke_nccl", "done: ")
ck_none, ck_block = losses("ckpt_none"), losses("ckpt_block")  # reported, not part of "ok"
res["act_ckpt_steps"] = [len(ck_none), len(ck_block)]
res["act_ckpt_bit_identical"] = len(ck_none) == 10 and ck_none == ck_block
res["ok"] = all(res.get(k) is True for k in ("finite", "falling", "resume_within_2pct", "deferred_within_2pct",
                                             "deferred_used", "resumed", "nccl_world1"))
print(json.dumps(res))
PY
cat "$R/smoke.json"
SMOKE_OK=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1])).get('ok', False)))" "$R/smoke.json" \
           2>/dev/null || echo 0)
rm -rf runs/gpu_smoke_*
pack

if [ "${GPU_TESTS:-1}" = 1 ]; then
  log "tests: trainer_tests and models_tests OptimCuda.*, Optim.*, Device.*; tensorboard_tests *Python*"
  if run 150 tests_build env NINJA_JOBS=16 TARGETS="trainer_tests models_tests tensorboard_tests" bash launch/gpu-build.sh; then
    run 60 trainer_tests $B/trainer_tests --gtest_filter='OptimCuda.*:Optim.*:Device.*'
    run 60 models_tests $B/models_tests --gtest_filter='Optim.*:HeadLoss*:*Sdpa*'
    run 60 tensorboard_tests $B/tensorboard_tests --gtest_filter='*Python*'
  fi
  pack
fi

python3 bench/gpu_summary.py "$R" | tee "$R/result.json"
log "done"
pack
[ "$SMOKE_OK" = 1 ] || { echo "SMOKE FAILED: see smoke.json" >&2; exit 1; }
