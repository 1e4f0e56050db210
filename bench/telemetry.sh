#!/usr/bin/env bash
# What telemetry costs, as an A/B of the step time: metrics every step vs every 1000 steps, with
# TensorBoard on and off, on the tiny and kjv configs. Rounds alternate the variants (order rotated
# each round) so drift hits all; each round's ratios compare its own runs (drift between rounds
# cancels), and the median ratio over rounds to the quietest (every 1000 steps, TensorBoard off) is
# reported with its range. Beside it, the cost measured inside each run (summary.json): the
# training thread's time building and enqueueing records plus the metrics sink thread's CPU time,
# per step; on this shared 2-core machine run-to-run drift (+-15%) hides effects below a few %.
# Step time: the whole step, its logging included: each variant runs twice, N steps and N/5 (at
# least 2), and the step time is the difference of the two runs' loop time (summary.json wall_s:
# from the first step to the end of the run, every record built, enqueued and written) over the
# difference of their steps, so what every run does once (the first step, the final checkpoint and
# weights, the last flush of the metrics) cancels. (summary.json tokens_per_s times the steps
# alone, before their records are built: it cannot see the logging.) Data: the King James Bible
# with the bytes tokenizer (model.vocab_size pads the vocabulary to the kjv config's 4096, so the
# shapes are the main job's).
# usage: bench/telemetry.sh [--rounds R] [--tiny-steps N] [--kjv-steps N]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=3 TINY_STEPS=300 KJV_STEPS=20
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2 ;; --tiny-steps) TINY_STEPS=$2 ;; --kjv-steps) KJV_STEPS=$2 ;;
    *) echo "telemetry.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
[ -x build/bin/trainer ] || bash launch/dev/build.sh trainer prep >&2
WORK=$(mktemp -d /tmp/lmtel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
if command -v bible >/dev/null; then bible -f "Gen1:1-Rev22:21" > "$WORK/corpus.txt"
else for i in $(seq 20000); do echo "in the beginning god created the heaven and the earth $i"; done > "$WORK/corpus.txt"; fi
build/bin/prep "$WORK/corpus.txt" --out "$WORK/data" --tokenizer bytes --quiet >&2
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs" >&2
variants=("1 true" "1000 true" "1 false" "1000 false")
for r in $(seq "$ROUNDS"); do
  for cfg in tiny kjv; do
    steps=$TINY_STEPS; [ $cfg = kjv ] && steps=$KJV_STEPS
    for i in 0 1 2 3; do
      read -r every tb <<< "${variants[$(( (i + r) % 4 ))]}"
      short=$(( steps / 5 > 2 ? steps / 5 : 2 ))
      for n in $short $steps; do  # the short run first, then the long one, back to back
        dir="$WORK/$cfg.$every.$tb.$r.$n"
        build/bin/trainer configs/$cfg.yaml "run.dir=$dir" "data.train=$WORK/data" model.vocab_size=4096 \
          "train.max_steps=$n" "log.every_steps=$every" "log.tensorboard=$tb" eval.batches=0 \
          checkpoint.every_steps=0 >/dev/null 2>&1
      done
      echo "{\"round\": $r, \"cfg\": \"$cfg\", \"every\": $every, \"tensorboard\": $tb, \"short\": \"$WORK/$cfg.$every.$tb.$r.$short\", \"short_steps\": $short, \"dir\": \"$WORK/$cfg.$every.$tb.$r.$steps\", \"steps\": $steps}" >> "$WORK/runs.jsonl"
    done
  done
  echo "round $r done" >&2
done
/usr/bin/python3 - "$WORK/runs.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def step_ms(r):  # the whole step, logging included: the two runs' difference of loop time over steps
    wall = lambda d: json.load(open(d + "/summary.json"))["wall_s"]
    return 1e3 * (wall(r["dir"]) - wall(r["short"])) / (r["steps"] - r["short_steps"])
out = {"window": "step time = (summary.json wall_s of N steps - of N/5 steps) / (N - N/5): the whole step, its "
                  "records built, enqueued and written included, what each run does once cancelled; "
                  "ratio = a variant's step time over the quietest variant's (every 1000 steps, TensorBoard off) "
                  "in the same round, median over rounds with its range"}
for cfg in ("tiny", "kjv"):
    ms, direct = {}, {}
    for r in rows:
        if r["cfg"] == cfg:
            key = (r["round"], r["every"], r["tensorboard"])
            s = json.load(open(r["dir"] + "/summary.json"))
            ms[key] = step_ms(r)
            direct[key] = s["telemetry_ms_per_step"] + s.get("telemetry_sink_cpu_ms_per_step", 0)
    rounds = sorted({k[0] for k in ms})
    res = {}
    for every in (1, 1000):
        for tb in (True, False):
            ratios = [ms[(k, every, tb)] / ms[(k, 1000, False)] for k in rounds]
            res[f"every{every}_tb{'on' if tb else 'off'}"] = {
                "step_ms": round(statistics.median(ms[(k, every, tb)] for k in rounds), 3),
                "ratio_to_quietest": round(statistics.median(ratios), 4),
                "ratio_range": [round(min(ratios), 4), round(max(ratios), 4)],
                # measured inside the run: the training thread's time building and enqueueing
                # records plus the sink thread's CPU time, per step, as a share of the step
                "direct_ms_per_step": round(statistics.median(direct[(k, every, tb)] for k in rounds), 4),
                "direct_pct_of_step": round(100 * statistics.median(direct[(k, every, tb)] / ms[(k, every, tb)] for k in rounds), 4)}
    out[cfg] = res
print(json.dumps(out, indent=1))
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
