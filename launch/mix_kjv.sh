#!/usr/bin/env bash
# The data-mixture example: prepares the Old and the New Testament (Debian's bible-kjv) as two
# sources with ONE tokenizer (the whole Bible's, shards/kjv, made as launch/kjv.sh makes it), then
# trains configs/mix_kjv.yaml and prints its realised mixture per logged window (metrics.jsonl).
# Extra arguments are config overrides for the trainer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash launch/dev/build.sh
if [ ! -f shards/kjv/manifest.json ]; then
  bible -f "Gen1:1-Rev22:21" | build/bin/prep - --out shards/kjv --tokenizer sentencepiece --vocab-size 4096
fi
prep_part() {  # NAME VERSE-RANGE
  [ -f "shards/kjv_$1/manifest.json" ] && return
  bible -f "$2" | build/bin/prep - --out "shards/kjv_$1" --tokenizer sentencepiece --sp-model shards/kjv/tokenizer.model
}
prep_part ot "Gen1:1-Mal4:6"
prep_part nt "Mat1:1-Rev22:21"
build/bin/trainer configs/mix_kjv.yaml "$@"
run_dir=runs/mix_kjv
for a in "$@"; do case "$a" in run.dir=*) run_dir=${a#run.dir=} ;; esac; done
echo "== realised mixture ($run_dir/metrics.jsonl): step, tokens per source in the window, cumulative"
/usr/bin/python3 - "$run_dir/metrics.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") != "train" or "source_tokens" not in r: continue
    w, t = r["source_tokens"], r["source_tokens_total"]
    share = " ".join(f"{k} {100 * v / sum(w.values()):.1f}%" for k, v in w.items())
    print(f"step {r['step']:5d}  window: {share}  cumulative: {t}")
PY
