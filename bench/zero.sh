#!/usr/bin/env bash
# ZeRO-1's memory on CPU over Gloo, in one run: world sizes 1, 2 and 4 (build/bin/launch, one
# thread per rank), dist.zero 0 and 1, the same model and per-rank batch. Per rank: the optimizer
# state the trainer allocated (its start-up line "optimizer state N MB") and the peak RSS of the
# whole process (/usr/bin/time's maximum resident set: weights, gradients, moments, EMA, activations,
# LibTorch's own), and the run's tokens/s (summary.json: the timed steps, all ranks' tokens). The
# memory window is the whole process, start-up to exit, STEPS steps; ratios are against dist.zero 0
# at the same world size.
# usage: bench/zero.sh [--steps N]         (needs shards/kjv: run launch/kjv.sh first)
#   env MODEL: trainer overrides for the model (default: the kjv data at d_model 512, 8 layers,
#   ~27M weights, so the 216 MB of moments stand out of the process's own ~150 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=12
[ "${1:-}" = "--steps" ] && STEPS=$2
[ -f shards/kjv/manifest.json ] || { echo "zero.sh: run launch/kjv.sh first (needs shards/kjv)" >&2; exit 2; }
[ -x build/bin/trainer ] && [ -x build/bin/launch ] || bash launch/build.sh trainer launch >&2
WORK=$(mktemp -d /tmp/lmzero.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
read -r -a model <<< "${MODEL:-model.d_model=512 model.n_layer=8 model.n_head=8 model.seq_len=128}"
args=(configs/kjv.yaml "${model[@]}" "train.max_steps=$STEPS" "train.micro_batch_size=4" "log.every_steps=$STEPS"
      "eval.batches=0" "checkpoint.every_steps=0" "train.threads=1" "log.tensorboard=false" "dist.backend=gloo")
for world in 1 2 4; do
  for zero in 0 1; do
    name="w${world}_z${zero}"
    mkdir -p "$WORK/$name"
    # Each rank under /usr/bin/time: its peak RSS in rss.<rank>.
    build/bin/launch --standalone --nproc-per-node "$world" --log-dir "$WORK/$name/logs" -- \
      bash -c 'exec /usr/bin/time -f %M -o "$0/rss.$RANK" build/bin/trainer "$@"' "$WORK/$name" \
      "${args[@]}" "dist.zero=$zero" "run.dir=$WORK/$name/run" > "$WORK/$name/out.log" 2>&1 ||
      { tail -20 "$WORK/$name/out.log" >&2; echo "zero.sh: $name failed" >&2; exit 1; }
  done
done
/usr/bin/python3 - "$WORK" "$STEPS" <<'PY'
import glob, json, os, re, sys
work, steps = sys.argv[1], int(sys.argv[2])
rows = {}
for world in (1, 2, 4):
    for zero in (0, 1):
        d = f"{work}/w{world}_z{zero}"
        text = open(f"{d}/out.log", errors="replace").read()
        # Every rank's start-up line names its optimizer state (the launcher prefixes [rankR]:).
        state = [float(x) for x in re.findall(r"optimizer state ([0-9.]+) MB", text)]
        rss = [int(open(f).read().split()[-1]) / 1024 for f in sorted(glob.glob(f"{d}/rss.*"))]
        summ = json.load(open(f"{d}/run/summary.json"))
        rows[(world, zero)] = {"world": world, "zero": zero, "optimizer_state_mb_per_rank": max(state) if state else None,
                               "peak_rss_mb_per_rank_max": round(max(rss), 1), "peak_rss_mb_per_rank_min": round(min(rss), 1),
                               "ranks_measured": len(rss), "last_loss": summ.get("last_loss"),
                               "tokens_per_s": summ.get("tokens_per_s")}
print(f"zero.sh: {steps} steps, one thread per rank; optimizer state from each rank's start-up line, peak RSS of each "
      "rank's whole process (start-up to exit); ratios: dist.zero=1 over dist.zero=0 at the same world size")
print(f"{'world':>5} {'zero':>4} {'opt state MB/rank':>18} {'ratio':>6} {'peak RSS MB/rank':>17} {'ratio':>6} "
      f"{'tokens/s':>9} {'ratio':>6}")
for (world, zero), r in rows.items():
    base = rows[(world, 0)]
    so = r["optimizer_state_mb_per_rank"] / base["optimizer_state_mb_per_rank"]
    ro = r["peak_rss_mb_per_rank_max"] / base["peak_rss_mb_per_rank_max"]
    to = r["tokens_per_s"] / base["tokens_per_s"]
    print(f"{world:>5} {zero:>4} {r['optimizer_state_mb_per_rank']:>18.1f} {so:>6.3f} {r['peak_rss_mb_per_rank_max']:>17.1f} {ro:>6.3f} "
          f"{r['tokens_per_s']:>9.0f} {to:>6.3f}")
print(json.dumps(list(rows.values())))
PY
