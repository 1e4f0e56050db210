#!/usr/bin/env python3
"""The fault matrix: short real trainings, each with one seeded fault, restarted with the same
command until done and compared with an uninterrupted run (see tests/faults/README.md).

  python3 tests/faults/fault_matrix.py --bin build/bin --faults 21     # CI's short form
  python3 tests/faults/fault_matrix.py --bin build/bin --faults 200    # the long form

Faults, in turn (each with its own seeded draw):
  kill_time     SIGKILL of the trainer at a random moment of the run
  kill_rank     SIGKILL of one rank of a 2-rank run under build/bin/launch, at a random moment
  kill_writer   SIGKILL of the asynchronous checkpoint writer at its Nth file-system call
  kill_rename   SIGKILL just before the Nth rename (checkpoint commits, atomic files)
  kill_renamed  SIGKILL just after the Nth rename, before its directory is fsync'd
  enospc        the disk is full from the Nth write on (first attempt only)
  eio           the Nth write fails with EIO
  fsync_eio     the Nth fsync fails with EIO
  powercut      a power cut at the Nth file-system call: every byte not fsync'd is lost
The file-system faults go through build/bin/fault_trainer (the trainer with the injectable
files::FileSystem of tests/faults/fault_fs.h); kill_time/kill_rank send real signals.

Per fault: recovered (a later attempt exited 0), byte-identical (per-step losses and the final
model.safetensors equal the uninterrupted run's), data lost (a restart resumed from an earlier step
than the newest checkpoint that was durable before the fault, or a checkpoint directory failed
verification). Exit status 1 unless every fault recovered byte-identically with 0 data lost.
"""
import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KINDS = ["kill_time", "kill_rank", "kill_writer", "kill_rename", "kill_renamed", "enospc", "eio",
         "fsync_eio", "powercut"]
MAX_ATTEMPTS = 6
STEPS = 24


def corpus(lines=1500, seed=7):
    words = ("and the lord said unto moses in beginning god created heaven earth was without form "
             "light darkness waters spirit upon face deep day night evening morning").split()
    rng = random.Random(seed)
    return "".join(" ".join(rng.choice(words) for _ in range(4 + rng.randrange(16))) + ".\n"
                   for _ in range(lines))


def overrides(data, run, extra=()):
    return ["model.n_layer=2", "model.n_head=2", "model.d_model=32", "model.seq_len=32",
            "model.dropout=0.1", f"data.train={data}", f"run.dir={run}", f"train.max_steps={STEPS}",
            "train.micro_batch_size=4", "train.threads=1", "log.every_steps=1", "log.tensorboard=false",
            "eval.every_steps=8", "eval.batches=2", "checkpoint.every_steps=3", "checkpoint.keep_last=2",
            "run.seed=5", *extra]


class Matrix:
    def __init__(self, args):
        self.bin = os.path.abspath(args.bin)
        self.src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        self.config = os.path.join(self.src, "configs", "tiny.yaml")
        self.work = tempfile.mkdtemp(prefix="fault_matrix.", dir=args.work)
        self.keep = args.keep
        self.verbose = args.verbose
        self.data = os.path.join(self.work, "data")
        with open(os.path.join(self.work, "corpus.txt"), "w") as f:
            f.write(corpus())
        subprocess.run([f"{self.bin}/prep", os.path.join(self.work, "corpus.txt"), "--out", self.data,
                        "--tokenizer", "bytes", "--val-fraction", "0.05", "--quiet"], check=True)

    def close(self):
        if not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)

    # ---- commands -------------------------------------------------------------------------------
    def trainer_cmd(self, run, fault=None, extra=()):
        cmd = [f"{self.bin}/fault_trainer", "--journal", os.path.join(run, "journal"),
               "--counts", os.path.join(run, "counts")]
        if fault:
            cmd += ["--fault", fault]
        return cmd + ["--", self.config, *overrides(self.data, run, extra)]

    def launch_cmd(self, run, run_id):
        return [f"{self.bin}/launch", "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
                "--run-id", run_id, "--log-dir", os.path.join(run, "launch_logs"),
                "--", f"{self.bin}/trainer", self.config, *overrides(self.data, run)]

    def start(self, cmd, run, attempt):
        os.makedirs(run, exist_ok=True)
        out = open(os.path.join(run, f"attempt_{attempt}.out"), "w")
        env = dict(os.environ, OMP_NUM_THREADS="1")
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def run_to_end(self, cmd, run, attempt, timeout=600):
        p = self.start(cmd, run, attempt)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            return "timeout"

    # ---- results --------------------------------------------------------------------------------
    @staticmethod
    def losses(run):
        """{step: loss} of the train records (log.every_steps=1: every step)."""
        out = {}
        try:
            with open(os.path.join(run, "metrics.jsonl")) as f:
                for line in f:
                    r = json.loads(line)
                    if r.get("kind") == "train":
                        out[r["step"]] = r["loss"]
        except (OSError, ValueError):
            pass
        return out

    @staticmethod
    def weights(run):
        try:
            with open(os.path.join(run, "model.safetensors"), "rb") as f:
                return f.read()
        except OSError:
            return None

    @staticmethod
    def durable_steps(run):
        steps = []
        try:
            with open(os.path.join(run, "journal")) as f:
                for line in f:
                    m = re.match(r"durable .*/step_(\d+)$", line.strip())
                    if m:
                        steps.append(int(m.group(1)))
        except OSError:
            pass
        return steps

    @staticmethod
    def read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def reference(self, name, cmd_of):
        run = os.path.join(self.work, name)
        start = time.time()
        rc = self.run_to_end(cmd_of(run), run, 0)
        if rc != 0:
            sys.exit(f"fault_matrix: the uninterrupted run {name} failed ({rc}):\n" +
                     self.read(os.path.join(run, "attempt_0.out"))[-3000:])
        counts = dict(kv.split("=") for kv in self.read(os.path.join(run, "counts")).split()) if name != "ref_launch" else {}
        return {"losses": self.losses(run), "weights": self.weights(run), "seconds": time.time() - start,
                "counts": {k: int(v) for k, v in counts.items()}}

    # ---- one fault ------------------------------------------------------------------------------
    def inject(self, i, kind, rng, ref, ref_launch):
        run = os.path.join(self.work, f"f{i:03d}_{kind}")
        launch = kind == "kill_rank"
        base = ref_launch if launch else ref
        cmd = self.launch_cmd(run, f"fm{os.getpid()}x{i}") if launch else self.trainer_cmd(run)
        injected, detail = True, ""
        if kind in ("kill_time", "kill_rank"):
            delay = rng.uniform(0.05, 0.8) * base["seconds"]  # runs vary: most land inside the run
            detail = f"after {delay:.2f} s"
            p = self.start(cmd, run, 1)
            try:
                p.wait(delay)
                injected = False  # it ended before the signal
            except subprocess.TimeoutExpired:
                if launch:
                    victims = [c for c in children(p.pid)]
                    if victims:
                        victim = rng.choice(victims)
                        detail += f", rank pid {victim}"
                        os.kill(victim, signal.SIGKILL)
                    else:
                        injected = False
                else:
                    os.kill(p.pid, signal.SIGKILL)
            try:
                rc = p.wait(600)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                rc = "timeout"
        else:
            counter = {"kill_writer": None, "kill_rename": "renames", "kill_renamed": "renames", "enospc": "writes",
                       "eio": "writes", "fsync_eio": "syncs", "powercut": "calls"}[kind]
            n = rng.randint(1, 12) if counter is None else rng.randint(1, max(1, base["counts"][counter]))
            extra = ("checkpoint.async=true",) if kind == "kill_writer" else ()
            detail = f"{kind}@{n}"
            cmd = self.trainer_cmd(run, f"{kind}@{n}", extra)
            rc = self.run_to_end(cmd, run, 1)
            if kind == "kill_writer":
                injected = "kill_writer" in self.read(os.path.join(run, "journal"))
                cmd = self.trainer_cmd(run, None, extra)
            else:
                cmd = self.trainer_cmd(run)
        durable = max(self.durable_steps(run), default=0)
        attempts, resumed_ok, skipped = [rc], True, False
        while rc != 0 and len(attempts) < MAX_ATTEMPTS:
            rc = self.run_to_end(cmd, run, len(attempts) + 1)
            attempts.append(rc)
            out = self.read(os.path.join(run, f"attempt_{len(attempts)}.out"))
            if launch:
                out += "".join(self.read(os.path.join(dp, f)) for dp, _, fs in os.walk(os.path.join(run, "launch_logs")) for f in fs)
            skipped |= "skipping checkpoint" in out
            if len(attempts) == 2:  # the first restart: it must pick up the newest durable checkpoint
                m = re.search(r"resumed from \S+ at step (\d+)", out)
                resumed = int(m.group(1)) if m else 0
                resumed_ok = resumed >= durable
                detail += f", resumed at {resumed} (durable {durable})"
        recovered = rc == 0
        identical = recovered and self.losses(run) == base["losses"] and self.weights(run) == base["weights"]
        lost = (not resumed_ok) or skipped
        row = {"i": i, "kind": kind, "detail": detail, "injected": injected, "attempts": attempts,
               "recovered": recovered, "identical": identical, "lost": lost}
        if self.verbose or not (recovered and identical and not lost):
            print(f"  fault {i:3d} {kind:12s} {detail}: exits {attempts} recovered={recovered} "
                  f"identical={identical} data_lost={lost}", flush=True)
        if recovered and identical and not lost and not self.keep:
            shutil.rmtree(run, ignore_errors=True)
        return row


def children(pid):
    """Direct child pids of `pid` (its threads' children lists)."""
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build/bin", help="directory of fault_trainer, trainer, launch, prep")
    ap.add_argument("--faults", type=int, default=21, help="faults to inject (CI: 21, long form: 200)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the fault draws")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated subset of " + ",".join(KINDS))
    ap.add_argument("--work", default=None, help="parent of the scratch directory (default $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep every run directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per fault")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        sys.exit(f"fault_matrix: unknown kind(s) {bad}; known: {KINDS}")
    m = Matrix(args)
    t0 = time.time()
    try:
        ref = m.reference("ref", lambda run: m.trainer_cmd(run))
        ref_launch = m.reference("ref_launch", lambda run: m.launch_cmd(run, f"fm{os.getpid()}ref")) \
            if "kill_rank" in kinds else None
        print(f"fault_matrix: uninterrupted runs {ref['seconds']:.1f} s (1 rank)"
              + (f", {ref_launch['seconds']:.1f} s (2 ranks)" if ref_launch else "")
              + f"; fs calls {ref['counts']}", flush=True)
        rng = random.Random(args.seed)
        rows = [m.inject(i, kinds[i % len(kinds)], rng, ref, ref_launch) for i in range(args.faults)]
    finally:
        m.close()
    print_table(rows, kinds, time.time() - t0)
    ok = all(r["recovered"] and r["identical"] and not r["lost"] for r in rows)
    sys.exit(0 if ok else 1)


def print_table(rows, kinds, seconds):
    print(f"\n{'fault':14s} {'runs':>5s} {'injected':>9s} {'recovered':>10s} {'byte-identical':>15s} {'data lost':>10s}")
    total = {"runs": 0, "injected": 0, "recovered": 0, "identical": 0, "lost": 0}
    for k in kinds + ["total"]:
        rs = rows if k == "total" else [r for r in rows if r["kind"] == k]
        c = {"runs": len(rs), "injected": sum(r["injected"] for r in rs), "recovered": sum(r["recovered"] for r in rs),
             "identical": sum(r["identical"] for r in rs), "lost": sum(r["lost"] for r in rs)}
        print(f"{k:14s} {c['runs']:5d} {c['injected']:9d} {c['recovered']:10d} {c['identical']:15d} {c['lost']:10d}")
    print(f"({seconds:.0f} s)")


if __name__ == "__main__":
    main()
