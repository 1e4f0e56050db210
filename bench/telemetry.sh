#!/usr/bin/env bash
# What telemetry costs the training thread: the tiny config with a record EVERY step (console,
# metrics.jsonl, TensorBoard, long-window aggregates), timing the training thread's share (the
# trainer measures the time spent handing records to the metrics thread: summary.json
# telemetry_ms_per_step), next to the step time. Goal: well under 1 ms per step.
# usage: bench/telemetry.sh [--steps N]        (needs shards/kjv: run launch/kjv.sh first)
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=300
[ "${1:-}" = "--steps" ] && STEPS=$2
[ -f shards/kjv/manifest.json ] || { echo "telemetry.sh: run launch/kjv.sh first (needs shards/kjv)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/lmtel.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
build/bin/trainer configs/tiny.yaml "run.dir=$WORK/run" "train.max_steps=$STEPS" log.every_steps=1 \
  log.long_window_s=1 eval.batches=0 >/dev/null 2>&1
/usr/bin/python3 - "$WORK/run" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
recs = [json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl")]
train = [r for r in recs if r.get("kind") == "train"]
print(json.dumps({"steps": s["steps"], "records": len(recs), "step_ms_mean": round(sum(r["step_ms"] for r in train) / len(train), 3),
                  "telemetry_ms_per_step": s["telemetry_ms_per_step"]}))
PY
