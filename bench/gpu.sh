#!/usr/bin/env bash
# The GPU check, ONE device run of at most 10 minutes. Phases, each under a time
# limit, the headline comparison first (a run cut short by the limit still has it):
#   build    trainer + prep only against pip LibTorch 2.x + CUDA (launch/gpu-build.sh; every
#            compile error of the run shown, ninja -k 0)
#   speed    GPT-2 124M (micro-batch 16 x 1024, bf16) from real shards through the streaming loader,
#            reading step results at once and one step late
#   peer     bench/peers/gpt_torch.py, same shape: eager, then
#            torch.compile
#   smoke    4-layer GPT-2 shape, 40 steps: loss finite and falling; a run stopped at 25 and resumed
#            follows the uninterrupted one (same pinned cosine schedule); step results read one step
#            late (anomaly.spike_factor=0) follow a run that reads them at once; one rank with an
#            NCCL process group (dist.backend=nccl at world size 1: the all-reduce path runs)
#   tests    trainer_tests' and models_tests' CUDA cases (fused AdamW vs CPU) and the TensorBoard Python cross-check
# Every result lands in $OUT/gpu_results.tar.gz (written to a temporary name and renamed after each
# phase, so a run cut short still returns a whole archive); result.json sums it up and is printed. Exit 1 when the build or
# the smoke failed.
# usage (on the GPU machine; launch/gpu-deps.sh ran here first and .deps/ is carried):
#   bash bench/gpu.sh          env: STEPS (60), BUDGET_S (570), GPU_TESTS (1)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu_out}
R=$(mktemp -d /tmp/gpu_results.XXXX)  # results before packing
STEPS=${STEPS:-60}
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
pack

log "data: the King James Bible, bytes tokenizer (the 124M shape pads vocab_size 50257 to 50304)"
rm -rf shards/kjv_bytes
run 60 prep $B/prep .deps/kjv.txt --out shards/kjv_bytes --tokenizer bytes --quiet

log "speed: trainer, GPT-2 124M, 16 x 1024, bf16, $STEPS steps (immediate, then deferred step reads)"
speed=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes train.max_steps=$STEPS log.every_steps=10 eval.batches=0
       checkpoint.every_steps=0 checkpoint.keep_last=1)
for mode in immediate deferred; do
  rm -rf runs/gpu_124m
  extra=(); [ $mode = deferred ] && extra=(anomaly.spike_factor=0)
  run 120 "trainer_$mode" $B/trainer "${speed[@]}" "${extra[@]}" run.dir=runs/gpu_124m
  for f in metrics.jsonl summary.json meta.json; do cp "runs/gpu_124m/$f" "$R/${mode}_$f" 2>/dev/null; done
  rm -rf runs/gpu_124m
  pack
done

PEER=bench/peers/gpt_torch.py
log "peer: eager"
run 120 peer_eager python3 $PEER --steps 30 --warmup 10 --grad-clip 1.0
pack

log "peer: torch.compile (the time that is left)"
run 180 peer_compile python3 $PEER --steps 30 --warmup 10 --grad-clip 1.0 --compile

pack

log "smoke: 4 layers, 40 steps; stopped at 25 and resumed; deferred vs immediate step reads"
common=(configs/gpt2-124m.yaml data.train=shards/kjv_bytes model.n_layer=4 train.max_steps=40 log.every_steps=5
        eval.batches=0 checkpoint.every_steps=10 checkpoint.keep_last=1 schedule.warmup_steps=10
        schedule.decay_steps=40)
rm -rf runs/gpu_smoke_*
run 90 smoke_a $B/trainer "${common[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_a
run 90 smoke_b1 $B/trainer "${common[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_b train.max_steps=25
run 90 smoke_b2 $B/trainer "${common[@]}" anomaly.spike_factor=0 run.dir=runs/gpu_smoke_b
run 90 smoke_c $B/trainer "${common[@]}" run.dir=runs/gpu_smoke_c
run 90 smoke_nccl $B/trainer "${common[@]}" dist.backend=nccl train.max_steps=10 run.dir=runs/gpu_smoke_n
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
res["nccl_world1"] = grep("smoke_nccl", "data parallel: nccl") and grep("smoke_nccl", "done: ")
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
    run 60 models_tests $B/models_tests --gtest_filter='Optim.*'
    run 60 tensorboard_tests $B/tensorboard_tests --gtest_filter='*Python*'
  fi
  pack
fi

python3 - "$R" <<'PY' | tee "$R/result.json"
import json, sys
r = sys.argv[1]
def load(path):  # the last JSON object line of a file (stderr is mixed into the logs)
    try: lines = open(f"{r}/{path}").read().splitlines()
    except OSError: return None
    for line in reversed(lines):
        if line.startswith("{"):
            try: return json.loads(line)
            except ValueError: pass
    return None
out = {"smoke": load("smoke.json")}
for mode in ("immediate", "deferred"):
    try: recs = [json.loads(l) for l in open(f"{r}/{mode}_metrics.jsonl")]
    except OSError: continue
    recs = [x for x in recs if x.get("kind") == "train"][1:]  # the first window holds start-up
    if not recs: continue
    mfu = [x["mfu_pct"] for x in recs if x.get("mfu_pct") is not None]
    out[f"trainer_{mode}"] = {"tokens_per_s": round(sum(x["tokens_per_s"] for x in recs) / len(recs)),
                              "step_ms": round(sum(x["step_ms"] for x in recs) / len(recs), 2),
                              "mfu_pct": round(sum(mfu) / len(mfu), 1) if mfu else None,
                              "data_wait_pct": round(sum(x["data_wait_pct"] for x in recs) / len(recs), 3)}
for name in ("peer_eager", "peer_compile"):
    p = load(f"{name}.log")
    if p: out[name] = {k: p.get(k) for k in ("tokens_per_s", "step_ms", "mfu_pct")}
for mode in ("immediate", "deferred"):
    t = out.get(f"trainer_{mode}")
    for peer in ("peer_eager", "peer_compile"):
        if t and out.get(peer) and out[peer].get("tokens_per_s"):
            t[f"vs_{peer}"] = round(t["tokens_per_s"] / out[peer]["tokens_per_s"], 3)
print(json.dumps(out, indent=1))
PY
log "done"
pack
[ "$SMOKE_OK" = 1 ] || { echo "SMOKE FAILED: see smoke.json" >&2; exit 1; }
