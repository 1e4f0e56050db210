#!/usr/bin/env bash
# Remote datasets vs local, in one run on the same shards:
#   1. loader tokens/s (build/bin/loader_bench, packed, 2 workers) from the local directory and over
#      loopback HTTP (nginx) with a cold cache (fresh each round) and a warm one;
#   2. the kjv config (configs/kjv.yaml, STEPS steps, eval off) trained from local shards and from
#      the same shards over HTTP with data.cache_limit_mb at 4 shards: tokens/s and data wait.
# Each configuration runs ROUNDS times, alternating; medians are reported. Loopback measures the
# pipeline's own cost (fetch, verify, cache, eviction), not a network.
#
# usage: bench/remote.sh [--tokens N] [--rounds R] [--steps S]
# env: BUILD_DIR (default build). Prints one JSON object with every run and the ratios remote/local.
set -euo pipefail
cd "$(dirname "$0")/.."
TOKENS=40000000 ROUNDS=3 STEPS=150
while [ $# -gt 0 ]; do
  case "$1" in
    --tokens) TOKENS=$2 ;; --rounds) ROUNDS=$2 ;; --steps) STEPS=$2 ;;
    *) echo "remote.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
BIN=${BUILD_DIR:-build}/bin
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || { echo "remote.sh: nginx not found (apt-get install nginx-light)" >&2; exit 2; }
WORK=$(mktemp -d /tmp/lmremote.XXXXXX)
NGINX_PID=""
trap '[ -n "$NGINX_PID" ] && kill "$NGINX_PID" 2>/dev/null; rm -rf "$WORK"' EXIT

# ---- data: a synthetic dataset in 8 shards, and the KJV in 5 shards of ~0.5 MB
"$BIN/loader_bench" --generate "$WORK/www/synth" --tokens "$TOKENS" --shard-tokens $((TOKENS / 8 + 1)) >&2
bible -f "Gen1:1-Rev22:21" | "$BIN/prep" - --out "$WORK/www/kjv" --tokenizer sentencepiece --vocab-size 4096 \
  --shard-tokens 250000 --quiet >&2

# ---- nginx on a free loopback port, serving $WORK/www
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
mkdir -p "$WORK/nginx/logs"
cat > "$WORK/nginx/nginx.conf" <<EOF
daemon off; master_process off; worker_processes 1; pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/logs/error.log;
events { worker_connections 256; }
http { access_log off; sendfile on;
  server { listen 127.0.0.1:$PORT; root $WORK/www; }
  client_body_temp_path $WORK/nginx/t1; proxy_temp_path $WORK/nginx/t2; fastcgi_temp_path $WORK/nginx/t3;
  uwsgi_temp_path $WORK/nginx/t4; scgi_temp_path $WORK/nginx/t5; }
EOF
"$NGINX" -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" -e "$WORK/nginx/logs/error.log" &
NGINX_PID=$!
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break; sleep 0.1; done
URL=http://127.0.0.1:$PORT

# ---- 1. loader tokens/s
BATCHES=3000  # seq 1024 x batch 16: 49M tokens, more than an epoch of the synthetic set
cat "$WORK"/www/synth/*.bin > /dev/null
for r in $(seq "$ROUNDS"); do
  "$BIN/loader_bench" --data "$WORK/www/synth" --seq 1024 --batch 16 --batches $BATCHES --warmup 0 \
    | sed 's/^{/{"source": "local", /' >> "$WORK/loader.jsonl"
  rm -rf "$WORK/cache"
  "$BIN/loader_bench" --data "$URL/synth" --cache-dir "$WORK/cache" --cache-mb 4096 --seq 1024 --batch 16 \
    --batches $BATCHES --warmup 0 | sed 's/^{/{"source": "http-cold", /' >> "$WORK/loader.jsonl"
  "$BIN/loader_bench" --data "$URL/synth" --cache-dir "$WORK/cache" --cache-mb 4096 --seq 1024 --batch 16 \
    --batches $BATCHES --warmup 0 | sed 's/^{/{"source": "http-warm", /' >> "$WORK/loader.jsonl"
done

# ---- 2. the kjv config, local vs remote with the cache at 4 shards
LIMIT=$(/usr/bin/python3 -c "import os,glob; print(4 * max(os.path.getsize(f) for f in glob.glob('$WORK/www/kjv/train_*.bin')) / 2**20)")
for r in $(seq "$ROUNDS"); do
  for src in local remote; do
    train=$WORK/www/kjv
    [ $src = remote ] && train=$URL/kjv
    rm -rf "$WORK/run" "$WORK/kjvcache"
    "$BIN/trainer" configs/kjv.yaml run.dir="$WORK/run" data.train="$train" train.max_steps="$STEPS" \
      eval.batches=0 log.every_steps=10 checkpoint.every_steps=0 data.cache_dir="$WORK/kjvcache" \
      data.cache_limit_mb="$LIMIT" data.remote_ahead=0 > "$WORK/kjv_$src.log" 2>&1 ||
      { cat "$WORK/kjv_$src.log" >&2; exit 1; }
    /usr/bin/python3 - "$WORK/run/metrics.jsonl" "$src" >> "$WORK/kjv.jsonl" <<'EOF'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if '"kind":"train"' in l]
recs = recs[1:] or recs  # the first window holds the start-up
n = len(recs)
print(json.dumps({"source": sys.argv[2], "tokens_per_s": sum(r["tokens_per_s"] for r in recs) / n,
                  "data_wait_pct": sum(r["data_wait_pct"] for r in recs) / n,
                  "data_wait_ms": sum(r["data_wait_ms"] for r in recs) / n}))
EOF
  done
done

/usr/bin/python3 - "$WORK/loader.jsonl" "$WORK/kjv.jsonl" "$LIMIT" <<'EOF'
import json, statistics, sys
loader = [json.loads(l) for l in open(sys.argv[1])]
kjv = [json.loads(l) for l in open(sys.argv[2])]
med = lambda rows, src, key: statistics.median(r[key] for r in rows if r["source"] == src)
out = {
  "loader_tokens_per_s": {s: med(loader, s, "tokens_per_s") for s in ("local", "http-cold", "http-warm")},
  "kjv": {s: {k: med(kjv, s, k) for k in ("tokens_per_s", "data_wait_pct", "data_wait_ms")} for s in ("local", "remote")},
  "kjv_cache_limit_mb": float(sys.argv[3]),
}
out["ratio_loader_http_cold_vs_local"] = out["loader_tokens_per_s"]["http-cold"] / out["loader_tokens_per_s"]["local"]
out["ratio_loader_http_warm_vs_local"] = out["loader_tokens_per_s"]["http-warm"] / out["loader_tokens_per_s"]["local"]
out["ratio_kjv_remote_vs_local_tokens_per_s"] = out["kjv"]["remote"]["tokens_per_s"] / out["kjv"]["local"]["tokens_per_s"]
out["runs"] = {"loader": loader, "kjv": kjv}
print(json.dumps(out, indent=1))
EOF
