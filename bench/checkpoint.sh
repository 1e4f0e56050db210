#!/usr/bin/env bash
# Checkpoint cost of GPT-2 124M + AdamW state (~1.5 GB) on CPU, side by side in one run with the
# raw sequential write speed of the same byte count on the same disk (dd ... conv=fsync) and
# LibTorch's torch::save of the same tensors. Goal: synchronous save >= 80% of dd's bandwidth.
# The async save's real stall (goal <= 5% of the synchronous save) is measured inside a training
# loop by bench/ckpt_stall.sh; async_call_ms here is the save() call alone.
# usage: bench/checkpoint.sh [DIR]   (DIR: scratch directory on the disk to measure; default /tmp)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${1:-/tmp}
[ -x build/bin/ckpt_bench ] || bash launch/dev/build.sh >&2
WORK=$(mktemp -d "$BASE/lmckpt.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ours=$(build/bin/ckpt_bench --dir "$WORK" --reps 2)
mb=$(echo "$ours" | /usr/bin/python3 -c 'import json,sys; print(int(json.load(sys.stdin)["state_mb"]))')
dd_best=0
for r in 1 2; do
  out=$(dd if=/dev/zero of="$WORK/dd.bin" bs=1M count="$mb" conv=fsync 2>&1 | tail -n 1)
  rm -f "$WORK/dd.bin"
  # "1493172224 bytes (1.5 GB, 1.4 GiB) copied, 1.2 s, 1.2 GB/s": bytes / seconds
  rate=$(echo "$out" | awk -F', ' '{split($1,b," "); split($3,s," "); printf "%.1f", b[1]/s[1]/1e6}')
  dd_best=$(/usr/bin/python3 -c "print(max($dd_best, $rate))")
done
/usr/bin/python3 - "$ours" "$dd_best" <<'PY'
import json, sys
o = json.loads(sys.argv[1]); dd = float(sys.argv[2])
o["dd_mb_per_s"] = dd
o["sync_vs_dd"] = round(o["sync_mb_per_s"] / dd, 3)
o["torch_save_vs_dd"] = round(o["torch_save_mb_per_s"] / dd, 3)
print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in o.items()}))
PY
