#!/usr/bin/env bash
# The GPU check: ONE device run of at most 10 minutes (docs/gpu.md: the exact call, the preparation,
# the phase budget). Phases in order; each one starts only when the time it needs (NEED below, in
# GPU seconds) is left of BUDGET_S, else it is recorded "skipped (time)"; a phase that started and
# ran out of budget is "cut (time)"; neither is a failure. Every phase ends with the results packed,
# so a run stopped by the device's limit still returns everything done before.
#   build         trainer + prep against pip LibTorch 2.x + CUDA (launch/dev/gpu-build.sh; every
#                 compile error of the run shown, ninja -k 0), limit BUILD_S
#   data          the King James Bible through prep (bytes tokenizer) into shards/kjv_bytes
#   smoke         4 layers at the 124M width, 40 steps: loss finite and falling (the NaN check); a run
#                 stopped at 25 and resumed follows the uninterrupted one (save/resume); step results
#                 read one step late follow a run that reads them at once; one rank in an NCCL process
#                 group (dist.backend=nccl at world size 1)
#   A/B           GPT-2 124M (micro-batch 16 x 1024, bf16) from real shards through the streaming loader,
#                 $STEPS steps per variant, the first window (start-up) left out of each mean, one phase
#                 per variant, the most informative first:
#                   all_on     every switch of the GPU step on (train.fused_loss, optim.free_grads,
#                              optim.clip_in_step): the candidate defaults
#                   peer_eager bench/peers/gpt_torch.py, same shape, eager (cheap, and the headline
#                              ratio needs it in the same run: right after all_on)
#                   all_off    today's step (each switch off)
#                   no_<sw>    all_on with one switch off (what that switch alone is worth), three
#                   residual   all_on + train.bf16_residual=true (numerics differ: see parity)
#                   act_ckpt   all_on + train.activation_checkpointing=block (peak memory vs tokens/s)
#                 all_on and all_off record Kineto traces of 3 more steps after the timed ones
#                 (log.profile_steps), the peers torch.profiler traces likewise (--trace):
#                 RUN/traces/*.trace.json + *.top.json (top kernels by GPU time)
#   peer_compile  the peer under torch.compile (the one to beat; ~90 s of it compiling)
#   ckpt_dropout  train.activation_checkpointing block vs none with dropout, 10 steps (reported:
#                 bit-identical?)
#   parity        train.bf16_residual on vs off, 4 layers at the 124M width, 300 steps: the loss curves
#   tests         only with GPU_TESTS=1: trainer_tests' and models_tests' CUDA cases and the
#                 TensorBoard Python cross-check
# Results: $OUT/gpu_results.tar.gz (written to a temporary name and renamed after each phase), with
# result.json (bench/gpu_summary.py, remade after each phase: phases and their status, tokens/s per
# variant, each switch's worth, ratios to the peer, top kernels side by side, the defaults the numbers
# pick) and phases.tsv inside; at the end result.json and the phase table are printed (the table last).
# Exit 0: every phase that ran passed; 1: the build, the data or the smoke failed; 3: the smoke was
# skipped or cut for time (nothing failed, nothing verified), or the data phase was.
# usage (on the GPU machine; launch/dev/gpu-deps.sh ran here first and .deps/gpu/ is carried):
#   bash bench/gpu.sh          env: STEPS (50), BUDGET_S (570), BUILD_S (420), GPU_TESTS (0),
#                              PHASES (the phases to run after build and data, by name; default all:
#                              a second call on the still-warm machine, whose build-gpu/ is kept,
#                              can run what the first skipped for time)
# A dry run of the script's own logic on a CPU (tiny shapes, no build, no tests; the LibTorch 2.6
# environment has every switch and torch.compile); phases.tsv holds each phase's CPU seconds:
#   bash launch/dev/torch2.sh shell env GPU_DRY=1 BIN=build-torch2/bin KJV=/tmp/kjv.txt bash bench/gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
R=$(mktemp -d /tmp/gpu_results.XXXX)  # results before packing
STEPS=${STEPS:-50}
BUDGET_S=${BUDGET_S:-570}
BUILD_S=${BUILD_S:-420}
GPU_TESTS=${GPU_TESTS:-0}
T0=$(date +%s)
mkdir -p "$OUT"
# What each phase needs on the GPU machine, in seconds: the estimate it is started against
# (docs/gpu.md, "Phase budget": start-up of a CUDA process ~10 s, a 124M step ~50-60 ms, a checkpoint
# of the 4-layer smoke model ~1 s, torch.compile of the peer ~60-90 s).
declare -A NEED=([data]=10 [smoke]=80 [all_on]=20 [peer_eager]=15 [all_off]=20 [no_fused_loss]=18
                 [no_free_grads]=18 [no_clip_in_step]=18 [residual]=18 [act_ckpt]=20 [peer_compile]=100
                 [ckpt_dropout]=25 [parity]=40 [tests]=300)
log() { echo "== [$(( $(date +%s) - T0 )) s] $*" | tee -a "$R/gpu.log"; }
left() { echo $(( BUDGET_S - ($(date +%s) - T0) )); }
summary() { python3 bench/gpu_summary.py "$R" > "$R/.result.json.tmp" 2>"$R/summary.err" && mv -f "$R/.result.json.tmp" "$R/result.json"; }
pack() { tar -czf "$OUT/.gpu_results.tar.gz.tmp" -C "$R" . 2>/dev/null && mv -f "$OUT/.gpu_results.tar.gz.tmp" "$OUT/gpu_results.tar.gz"; }
printf 'phase\tstatus\tseconds\tnote\n' > "$R/phases.tsv"
printf 'step\texit\tseconds\tlimit_s\tlimit_from\n' > "$R/steps.tsv"
PHASE="" PHASE_STATUS="" PHASE_T0=0 PHASE_NOTE=""
# phase NAME: starts phase NAME when NEED[NAME] seconds are left (returns 0), else records it
# "skipped (time)" (returns 1). A phase without a NEED (the build) always starts; with PHASES set,
# a phase it does not name (other than build and data) is recorded "not asked" and skipped.
phase() {
  PHASE=$1 PHASE_STATUS=ok PHASE_T0=$(date +%s) PHASE_NOTE=""
  if [ -n "${PHASES:-}" ] && [ "$1" != build ] && [ "$1" != data ] && [[ " $PHASES " != *" $1 "* ]]; then
    printf '%s\tnot asked\t0\tPHASES=%s\n' "$1" "$PHASES" >> "$R/phases.tsv"
    return 1
  fi
  local need=${NEED[$1]:-0} l; l=$(left)
  if [ "$l" -lt "$need" ]; then
    printf '%s\tskipped (time)\t0\tneeds ~%s s, %s s left\n' "$1" "$need" "$l" >> "$R/phases.tsv"
    log "$1: skipped (time): needs ~$need s, $l s left"
    summary; pack
    return 1
  fi
  log "$1 (needs ~$need s, $l s left)"
}
# phase_end [STATUS [NOTE]]: records the phase (STATUS defaults to what its steps left: ok, failed,
# cut (time)), remakes result.json and packs.
phase_end() {
  [ $# -ge 1 ] && PHASE_STATUS=$1
  [ $# -ge 2 ] && PHASE_NOTE=$2
  printf '%s\t%s\t%s\t%s\n' "$PHASE" "$PHASE_STATUS" "$(( $(date +%s) - PHASE_T0 ))" "$PHASE_NOTE" >> "$R/phases.tsv"
  log "$PHASE: $PHASE_STATUS${PHASE_NOTE:+ ($PHASE_NOTE)}"
  summary; pack
}
# run LIMIT_S NAME CMD...: one step of the phase, its output in $R/NAME.log, under LIMIT_S or the
# budget left, whichever is less. A step stopped by the budget leaves the phase "cut (time)"; one
# that fails or outlasts its own limit leaves it "failed". Returns the command's exit status.
run() {
  local limit=$1 name=$2 from=own l; shift 2
  l=$(left)
  [ "$limit" -gt "$l" ] && limit=$l from=budget
  if [ "$limit" -le 5 ]; then
    printf '%s\t-\t0\t%s\tbudget\n' "$name" "$limit" >> "$R/steps.tsv"
    log "$name: no time left"
    [ "$PHASE_STATUS" = failed ] || PHASE_STATUS="cut (time)"
    return 124
  fi
  local t=$(date +%s)
  timeout -k 5 "$limit" "$@" > "$R/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t ))" "$limit" "$from" >> "$R/steps.tsv"
  log "$name: exit $rc"
  if [ $rc -ne 0 ]; then
    if { [ $rc = 124 ] || [ $rc = 137 ]; } && [ $from = budget ]; then
      [ "$PHASE_STATUS" = failed ] || PHASE_STATUS="cut (time)"
    else
      PHASE_STATUS=failed
    fi
  fi
  return $rc
}
# finish: the summary, the phase table last (the device returns the output's tail), and the exit
# status from the build, data and smoke phases: 1 when one failed, 3 when the smoke did not run to its
# end for time (skipped or cut), else 0.
finish() {
  summary; log "done"; pack
  cat "$R/result.json" 2>/dev/null || cat "$R/summary.err"
  echo "== phases (budget $BUDGET_S s, $(( $(date +%s) - T0 )) s used)"
  column -t -s $'\t' "$R/phases.tsv" 2>/dev/null || cat "$R/phases.tsv"
  local p st
  declare -A logs=([build]=build.log [data]=prep.log [smoke]="smoke.json, smoke_*.log")
  for p in build data smoke; do
    st=$(awk -F'\t' -v p=$p '$1 == p {print $2}' "$R/phases.tsv")
    [ "$st" = failed ] && { echo "${p^^} FAILED: see ${logs[$p]} in gpu_results.tar.gz" >&2; exit 1; }
  done
  st=$(awk -F'\t' '$1 == "smoke" {print $2}' "$R/phases.tsv")
  { [ "$st" = ok ] || [ "$st" = "not asked" ]; } && exit 0
  echo "SMOKE ${st:-NOT RUN}: the budget ran out before it was done (not a failure, not a verdict)" >&2
  exit 3
}
export LD_LIBRARY_PATH="${DEPS:-/opt/deps}/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
B=build-gpu/bin
KJV=${KJV:-.deps/gpu/kjv.txt}
SHAPE=() PSHAPE=()  # extra trainer overrides / peer arguments (the dry run's tiny shapes)
export BACKEND=nccl  # the smoke's process group at world size 1
if [ "${GPU_DRY:-0}" = 1 ]; then
  B=${BIN:-build/bin} GPU_TESTS=0
  SHAPE=(train.device=cpu model.n_layer=2 model.d_model=64 model.n_head=2 model.seq_len=64 train.micro_batch_size=2
         optim.fused=on)  # the fused AdamW, which the switches need, is auto on CUDA only
  BACKEND=gloo
  PSHAPE=(--device cpu --layers 2 --dim 64 --heads 2 --seq 64 --vocab 320 --batch 2)
fi
printf '{"steps": %s, "budget_s": %s, "build_s": %s, "gpu_tests": %s, "dry": %s}\n' "$STEPS" "$BUDGET_S" "$BUILD_S" \
  "$GPU_TESTS" "${GPU_DRY:-0}" > "$R/settings.json"

phase build
if [ "${GPU_DRY:-0}" = 1 ]; then
  log "dry run: $B, tiny shapes on the CPU"
  phase_end "skipped (dry run)"
else
  nvidia-smi > "$R/nvidia-smi.txt" 2>&1
  build() { run "$BUILD_S" build env NINJA_JOBS=16 LM_BUILD_TESTS="$1" TARGETS="trainer prep" bash launch/dev/gpu-build.sh; }
  if ! build "$([ "$GPU_TESTS" = 1 ] && echo ON || echo OFF)"; then
    if [ "$GPU_TESTS" = 1 ] && grep -q "Configuring incomplete" "$R/build.log"; then
      # The tests' configuration failed there (GoogleTest?): build without them rather than lose the run.
      GPU_TESTS=0 PHASE_STATUS=ok; rm -rf build-gpu; mv "$R/build.log" "$R/build_with_tests.log"
      build OFF
    fi
  fi
  if [ "$PHASE_STATUS" != ok ]; then
    grep -m 40 -E "error|FAILED" "$R/build.log"; tail -15 "$R/build.log"
    phase_end; finish
  fi
  phase_end
fi

if phase data; then
  rm -rf shards/kjv_bytes
  run 60 prep $B/prep "$KJV" --out shards/kjv_bytes --tokenizer bytes --quiet
  [ "$PHASE_STATUS" = ok ] && [ ! -f shards/kjv_bytes/manifest.json ] && PHASE_STATUS=failed PHASE_NOTE="no manifest.json"
  phase_end
fi
[ -f shards/kjv_bytes/manifest.json ] || finish  # nothing after this runs without the data

common=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes model.n_layer=4 train.max_steps=40 log.every_steps=5
        eval.batches=0 checkpoint.every_steps=10 checkpoint.keep_last=1 schedule.warmup_steps=10
        schedule.decay_steps=40)
if phase smoke; then
  rm -rf runs/gpu_smoke_*
  run 90 smoke_nccl $B/trainer "${common[@]}" "${SHAPE[@]}" dist.backend=$BACKEND train.max_steps=10 run.dir=runs/gpu_smoke_n
  run 90 smoke_a $B/trainer "${common[@]}" "${SHAPE[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_a
  run 90 smoke_b1 $B/trainer "${common[@]}" "${SHAPE[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_b train.max_steps=25
  run 90 smoke_b2 $B/trainer "${common[@]}" "${SHAPE[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_b
  run 90 smoke_c $B/trainer "${common[@]}" "${SHAPE[@]}" run.dir=runs/gpu_smoke_c
  for d in a b c; do
    for f in metrics.jsonl summary.json meta.json; do cp "runs/gpu_smoke_$d/$f" "$R/smoke_${d}_$f" 2>/dev/null; done
  done
  python3 - "$R" > "$R/smoke.json" <<'PY'
import json, math, os, sys
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
res["nccl_world1"] = grep("smoke_nccl", "data parallel: " + os.environ["BACKEND"]) and grep("smoke_nccl", "done: ")
res["ok"] = all(res.get(k) is True for k in ("finite", "falling", "resume_within_2pct", "deferred_within_2pct",
                                             "deferred_used", "resumed", "nccl_world1"))
print(json.dumps(res))
PY
  cat "$R/smoke.json"
  rm -rf runs/gpu_smoke_*
  smoke_ok=$(python3 -c "import json,sys; print(int(json.load(open(sys.argv[1])).get('ok', False)))" "$R/smoke.json" \
             2>/dev/null || echo 0)
  # A smoke stopped by the budget is no verdict; one that ran to its end is ok or failed by its checks.
  if [ "$PHASE_STATUS" = "cut (time)" ]; then phase_end
  elif [ "$smoke_ok" = 1 ]; then phase_end ok
  else phase_end failed "see smoke.json"; fi
fi

ALL_ON=(train.fused_loss=on optim.free_grads=on optim.clip_in_step=on)
ALL_OFF=(train.fused_loss=off optim.free_grads=off optim.clip_in_step=off)
speed=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes log.every_steps=10 eval.batches=0
       checkpoint.every_steps=0 checkpoint.keep_last=1)
PROFILE="log.profile_steps=$((STEPS + 1))-$((STEPS + 3))"  # 3 steps after the timed ones
mkdir -p "$R/traces"
# trainer NAME OVERRIDES...: the phase NAME, one 124M run of $STEPS steps (or more: a profile after
# them, which result.json leaves out); its records (and profile/, if any) as $R/NAME_*.
trainer() {
  local name=$1; shift
  phase "$name" || return 0
  local steps=$STEPS
  [[ " $* " == *" log.profile_steps="* ]] && steps=$((STEPS + 3))
  rm -rf "runs/gpu_$name"
  run 90 "trainer_$name" $B/trainer "${speed[@]}" train.max_steps=$steps "$@" "${SHAPE[@]}" run.dir="runs/gpu_$name"
  for f in metrics.jsonl summary.json meta.json; do cp "runs/gpu_$name/$f" "$R/${name}_$f" 2>/dev/null; done
  if [ -d "runs/gpu_$name/profile" ]; then
    for f in "runs/gpu_$name"/profile/*; do cp "$f" "$R/traces/trainer_${name}.${f##*.rank0.}"; done
  fi
  rm -rf "runs/gpu_$name"
  phase_end
}
PEER=bench/peers/gpt_torch.py
peer() {  # peer NAME LIMIT ARGS...: the phase NAME, the peer's JSON line in $R/NAME.log
  local name=$1 limit=$2; shift 2
  phase "$name" || return 0
  run "$limit" "$name" python3 $PEER --steps 30 --warmup 10 --grad-clip 1.0 --trace "$R/traces" "$@" "${PSHAPE[@]}"
  phase_end
}

trainer all_on "${ALL_ON[@]}" "$PROFILE"
peer peer_eager 90
trainer all_off "${ALL_OFF[@]}" "$PROFILE"
trainer no_fused_loss "${ALL_ON[@]}" train.fused_loss=off
trainer no_free_grads "${ALL_ON[@]}" optim.free_grads=off
trainer no_clip_in_step "${ALL_ON[@]}" optim.clip_in_step=off
trainer residual "${ALL_ON[@]}" train.bf16_residual=true
trainer act_ckpt "${ALL_ON[@]}" train.activation_checkpointing=block  # memory (mem_mb: CUDA peak) vs time
peer peer_compile 180 --compile

# Activation checkpointing on the device: block vs none with dropout, 10 steps, every loss (the
# rerun must draw the same masks from the CUDA generator and pick the same kernels: bit-identical).
if phase ckpt_dropout; then
  for ck in none block; do
    run 60 "ckpt_dropout_$ck" $B/trainer "${common[@]}" "${SHAPE[@]}" model.dropout=0.1 train.max_steps=10 \
      log.every_steps=1 checkpoint.every_steps=0 train.activation_checkpointing=$ck run.dir=runs/gpu_ckpt_$ck
    cp "runs/gpu_ckpt_$ck/metrics.jsonl" "$R/ckpt_dropout_${ck}_metrics.jsonl" 2>/dev/null
    rm -rf "runs/gpu_ckpt_$ck"
  done
  phase_end
fi

if phase parity; then
  parity=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes model.n_layer=4 train.max_steps=300 log.every_steps=25
          eval.batches=0 checkpoint.every_steps=0 checkpoint.keep_last=1 schedule.warmup_steps=30
          schedule.decay_steps=300 "${ALL_ON[@]}")
  for res in false true; do
    rm -rf "runs/gpu_parity_$res"
    run 90 "parity_$res" $B/trainer "${parity[@]}" train.bf16_residual=$res "${SHAPE[@]}" run.dir="runs/gpu_parity_$res"
    cp "runs/gpu_parity_$res/metrics.jsonl" "$R/parity_${res}_metrics.jsonl" 2>/dev/null
    rm -rf "runs/gpu_parity_$res"
  done
  phase_end
fi

if [ "$GPU_TESTS" = 1 ] && phase tests; then
  if run 150 tests_build env NINJA_JOBS=16 TARGETS="trainer_tests models_tests tensorboard_tests" bash launch/dev/gpu-build.sh; then
    run 60 trainer_tests $B/trainer_tests --gtest_filter='OptimCuda.*:Optim.*:Device.*'
    run 60 models_tests $B/models_tests --gtest_filter='Optim.*:HeadLoss*:*Sdpa*'
    run 60 tensorboard_tests $B/tensorboard_tests --gtest_filter='*Python*'
  fi
  phase_end
fi

finish
