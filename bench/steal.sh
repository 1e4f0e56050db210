#!/usr/bin/env bash
# How much CPU the machine's disk writes take from computation on it: a busy loop on every CPU
# for SECONDS, alone and next to `dd` writing 1.5 GB with O_DIRECT to DIR, in one run, rounds
# alternating. Prints the loop's work with dd over its work alone, and the CPU time the hypervisor
# took from this machine's CPUs (/proc/stat steal) in each window. On a VM whose host handles the
# disk on the cores our CPUs run on, the ratio drops below 1: that is the part of an async
# checkpoint's stall (bench/ckpt_stall.sh, column "steal ms") that is not the trainer's.
# usage: bench/steal.sh [DIR] [SECONDS] [ROUNDS]
set -euo pipefail
DIR=${1:-/tmp}
SECS=${2:-3}
ROUNDS=${3:-2}
F=$(mktemp "$DIR/lmsteal.XXXXXX")
trap 'rm -f "$F"' EXIT
/usr/bin/python3 - "$F" "$SECS" "$ROUNDS" <<'PY'
import multiprocessing as mp, os, subprocess, sys, time
path, secs, rounds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
hz = os.sysconf("SC_CLK_TCK")

def steal_s():
    with open("/proc/stat") as f:
        return int(f.readline().split()[8]) / hz

def spin(q):
    t, n = time.time(), 0
    while time.time() - t < secs:
        n += 1
    q.put(n)

def window(with_dd):
    dd = None
    if with_dd:
        dd = subprocess.Popen(["dd", "if=/dev/zero", "of=" + path, "bs=8M", "count=180", "oflag=direct"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    q = mp.Queue()
    ps = [mp.Process(target=spin, args=(q,)) for _ in range(os.cpu_count())]
    s0 = steal_s()
    for p in ps:
        p.start()
    work = sum(q.get() for _ in ps)
    for p in ps:
        p.join()
    s1 = steal_s()
    if dd:
        dd.wait()
    return work, s1 - s0

print("%d CPUs, a busy loop on each for %.0f s; dd writes 1.5 GB (bs 8M, O_DIRECT) to %s" % (os.cpu_count(), secs, os.path.dirname(path)))
print("%-6s %14s %14s %10s %12s" % ("round", "work alone", "work with dd", "ratio", "steal s (alone / with dd)"))
for r in range(rounds):
    a, sa = window(False)
    b, sb = window(True)
    print("%-6d %14d %14d %10.2f %8.2f / %.2f" % (r, a, b, b / a, sa, sb))
PY
