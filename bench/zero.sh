#!/usr/bin/env bash
# ZeRO's memory on CPU over Gloo, in one run: world sizes 1, 2 and 4 (build/bin/launch, one thread
# per rank), dist.zero 0, 1, 2 and 3 (ZEROS), the same model and
# per-rank batch. Per rank: the bytes it keeps of the model state (weights 4N, gradients and
# optimizer state as its start-up line says: "optimizer state N MB", ZeRO-2's "gradients N MB"),
# the peak RSS of the whole process (/usr/bin/time's maximum resident set: weights, gradients,
# moments, activations, LibTorch's own), and the run's tokens/s (summary.json: the timed steps, all
# ranks' tokens). The memory window is the whole process, start-up to exit, STEPS steps; ratios are
# against dist.zero 0 at the same world size. The runs alternate over R rounds (default 1; the
# stages' order flipped every other round) and every number is the median over the rounds
# (tokens/s drifts with the machine's load; the memory barely moves), the rounds' tokens/s beside it.
# usage: bench/zero.sh [--steps N] [--rounds R]   (needs shards/kjv: run launch/kjv.sh first, and
#        /usr/bin/time: Debian package time, launch/dev/deps.sh)
#   env MODEL: trainer overrides for the model (default: the kjv data at d_model 768, 12 layers,
#   ~85M weights, micro-batch 1 x 128: the weights, gradients and moments dominate the activations)
#   env MICRO: train.micro_batch_size (default 1); env ZEROS: the stages (default "0 1 2 3"); env DATA:
#   the dataset (default shards/kjv); env BUCKET_MB: dist.bucket_mb (default 4: ZeRO-2 keeps up to
#   three buckets beside its pieces while the backward runs, so the buckets must be small against
#   the model for its saving to show; 25 MB buckets on a 100 MB model hide most of it)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=6
ROUNDS=1
usage() { echo "usage: bench/zero.sh [--steps N] [--rounds R]" >&2; exit 2; }
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case "$1" in
    --steps) STEPS=$2 ;;
    --rounds) ROUNDS=$2 ;;
    *) usage ;;
  esac
  shift 2
done
[[ "$STEPS" =~ ^[1-9][0-9]*$ ]] || { echo "zero.sh: --steps must be a whole number >= 1, got '$STEPS'" >&2; exit 2; }
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "zero.sh: --rounds must be a whole number >= 1, got '$ROUNDS'" >&2; exit 2; }
[ -x /usr/bin/time ] || { echo "zero.sh: /usr/bin/time missing (Debian package time: bash launch/dev/deps.sh)" >&2; exit 2; }
DATA=${DATA:-shards/kjv}
[ -f "$DATA/manifest.json" ] || { echo "zero.sh: run launch/kjv.sh first (needs $DATA)" >&2; exit 2; }
[ -x build/bin/trainer ] && [ -x build/bin/launch ] || bash launch/dev/build.sh trainer launch >&2
WORK=$(mktemp -d /tmp/lmzero.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export OMP_NUM_THREADS=1
read -r -a model <<< "${MODEL:-model.d_model=768 model.n_layer=12 model.n_head=12 model.seq_len=128}"
read -r -a stages <<< "${ZEROS:-0 1 2 3}"
args=(configs/kjv.yaml "data.train=$DATA" "${model[@]}" "train.max_steps=$STEPS" "train.micro_batch_size=${MICRO:-1}" "log.every_steps=$STEPS"
      "eval.batches=0" "checkpoint.every_steps=0" "train.threads=1" "log.tensorboard=false" "dist.backend=gloo" "dist.bucket_mb=${BUCKET_MB:-4}")
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
for r in $(seq "$ROUNDS"); do
  zeros=("${stages[@]}")
  [ $((r % 2)) = 0 ] && zeros=($(printf '%s\n' "${stages[@]}" | tac))
  for world in 1 2 4; do
    for zero in "${zeros[@]}"; do
      name="w${world}_z${zero}_r$r"
      echo "zero.sh: round $r/$ROUNDS, world $world, dist.zero=$zero" >&2
      mkdir -p "$WORK/$name"
      # Each rank under /usr/bin/time: its peak RSS in rss.<rank>.
      build/bin/launch --standalone --nproc-per-node "$world" --log-dir "$WORK/$name/logs" -- \
        bash -c 'exec /usr/bin/time -f %M -o "$0/rss.$RANK" build/bin/trainer "$@"' "$WORK/$name" \
        "${args[@]}" "dist.zero=$zero" "run.dir=$WORK/$name/run" > "$WORK/$name/out.log" 2>&1 ||
        { tail -20 "$WORK/$name/out.log" >&2; echo "zero.sh: $name failed" >&2; exit 1; }
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$WORK" "$STEPS" "$ROUNDS" "$load_before" "$load_after" "${stages[*]}" <<'PY'
import glob, json, os, re, statistics, sys
work, steps, rounds, load_before, load_after = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
stages = [int(z) for z in sys.argv[6].split()]
med = statistics.median
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
rows = {}
for world in (1, 2, 4):
    for zero in stages:
        state, grads, weights, rss_max, rss_min, toks, ranks, loss = [], [], [], [], [], [], [], []
        for r in range(1, rounds + 1):
            d = f"{work}/w{world}_z{zero}_r{r}"
            text = open(f"{d}/out.log", errors="replace").read()
            # Every rank's start-up line names its optimizer state (the launcher prefixes [rankR]:).
            s = [float(x) for x in re.findall(r"optimizer state ([0-9.]+) MB", text)]
            # The weights from the model line (4 bytes each); the gradients kept: ZeRO-2's line, else all of them.
            n = int(re.search(r"model: \S+, ([0-9]+) parameters", text).group(1))
            g = [float(x) for x in re.findall(r"gradients ([0-9.]+) MB of", text)]
            # ZeRO-3 keeps its pieces of the weights between steps: "zero-3: rank R keeps K of N weights".
            w3 = [int(k) for k in re.findall(r"zero-3: rank [0-9]+ keeps ([0-9]+) of [0-9]+ weights", text)]
            grads.append(max(g) if g else 4 * n / 1e6); weights.append(4 * max(w3) / 1e6 if w3 else 4 * n / 1e6)
            rss = [int(open(f).read().split()[-1]) / 1024 for f in sorted(glob.glob(f"{d}/rss.*"))]
            summ = json.load(open(f"{d}/run/summary.json"))
            state.append(max(s) if s else None)
            rss_max.append(max(rss)); rss_min.append(min(rss)); ranks.append(len(rss))
            toks.append(summ.get("tokens_per_s")); loss.append(summ.get("last_loss"))
        rows[(world, zero)] = {"world": world, "zero": zero,
                               "optimizer_state_mb_per_rank": None if None in state else med(state),
                               "weights_mb_per_rank": med(weights), "grads_mb_per_rank": med(grads),
                               "kept_mb_per_rank": None if None in state else med(weights) + med(grads) + med(state),
                               "peak_rss_mb_per_rank_max": round(med(rss_max), 1),
                               "peak_rss_mb_per_rank_min": round(med(rss_min), 1),
                               "ranks_measured": min(ranks), "last_loss": loss[0], "last_loss_rounds_equal": len(set(loss)) == 1,
                               "tokens_per_s": med(toks), "tokens_per_s_rounds": toks}
print(f"zero.sh: {steps} steps, one thread per rank, {rounds} rounds alternated, medians; optimizer state and "
      "gradients from each rank's start-up line (weights 4N, gradients 4N unless sharded; ZeRO-3's weights kept between steps), peak RSS of each rank's "
      "whole process (start-up to exit); ratios over dist.zero=0 at the same world size")
print(f"machine: {cpu}, {os.cpu_count()} cores; load average {load_before} before, {load_after} after")
print("| world | dist.zero | weights MB/rank | gradients MB/rank | optimizer state MB/rank | kept MB/rank | ratio "
      "| peak RSS MB/rank | ratio | tokens/s | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for (world, zero), r in rows.items():
    base = rows.get((world, 0), r)
    ko = r["kept_mb_per_rank"] / base["kept_mb_per_rank"]
    ro = r["peak_rss_mb_per_rank_max"] / base["peak_rss_mb_per_rank_max"]
    to = r["tokens_per_s"] / base["tokens_per_s"]
    print(f"| {world} | {zero} | {r['weights_mb_per_rank']:.1f} | {r['grads_mb_per_rank']:.1f} | "
          f"{r['optimizer_state_mb_per_rank']:.1f} | {r['kept_mb_per_rank']:.1f} | {ko:.3f} | "
          f"{r['peak_rss_mb_per_rank_max']:.0f} | {ro:.3f} | {r['tokens_per_s']:.0f} | {to:.3f} |")
print(json.dumps(list(rows.values())))
PY
