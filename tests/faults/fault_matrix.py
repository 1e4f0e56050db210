#!/usr/bin/env python3
"""The fault matrix: short real trainings, each with one seeded fault, restarted with the same
command until done and compared with an uninterrupted run (see tests/faults/README.md).

  python3 tests/faults/fault_matrix.py --bin build/bin --faults 21     # CI's short form
  python3 tests/faults/fault_matrix.py --bin build/bin --faults 200    # the long form

Faults, in turn (each with its own seeded draw):
  kill_time     SIGKILL of the trainer at a random moment of its training: a step drawn from
                1..24 is logged, then a fraction of a mean step time (checkpoint writes, evaluation
                and the final save included) passes
  kill_rank     SIGKILL of one rank of a 2-rank run under build/bin/launch (both ranks are
                fault_trainer without a fault: the journal has the durable steps), likewise
  kill_part     a 2-rank run with ZeRO (dist.zero 3, 2, 1 in turn: each rank writes its own part of
                the optimizer state, and under ZeRO-3 of the weights too) under build/bin/launch: one
                rank (drawn) is SIGKILLed at its Nth write into its part files, inside a sharded
                save; the launcher restarts the group
  kill_writer   SIGKILL of the asynchronous checkpoint writer at its Nth file-system call
  kill_rename   SIGKILL just before the Nth rename (checkpoint commits, atomic files)
  kill_renamed  SIGKILL just after the Nth rename, before its directory is fsync'd
  enospc        the disk is full from the Nth write on (first attempt only)
  eio           the Nth write fails with EIO
  fsync_eio     the Nth fsync fails with EIO
  powercut      a power cut at the Nth file-system call: every byte not fsync'd is lost
The file-system faults go through build/bin/fault_trainer (the trainer with the injectable
files::FileSystem of tests/faults/fault_fs.h); kill_time/kill_rank send real signals.

Per fault, each a measurement:
  injected      evidence from the process under test: the journal's "injected" line, written by
                fault_trainer's file system as the fault fires (op, path, call); for a signal, the
                process died of it (its exit status; kill_rank: the launcher's report) while the run
                had not completed (meta.json's status). Otherwise "not injected" (the run ended
                before the signal, the Nth call never came): shown as such, never counted recovered.
  recovered     a later attempt exited 0 (injected faults only)
  byte-identical  per-step losses and the final model.safetensors equal the uninterrupted run's
  data lost     for every process of every kind (the journal's "start" lines): it resumed from an
                earlier step than the newest checkpoint journalled durable before it started, or it
                found a committed checkpoint that does not verify (the trainer's "did not verify ...
                moved to" quarantine message)
Exit status 1 unless every injected fault recovered byte-identically, no run lost data and every
kind had at least one fault injected.
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
         "fsync_eio", "powercut", "kill_part"]
LAUNCHED = ("kill_rank", "kill_part")  # kinds run under build/bin/launch, 2 ranks
ZERO = ("dist.zero=1",)  # kill_part's reference run
# kill_part's faults take the stages in turn (ZeRO-3 first: CI's short form draws two kill_part faults).
# Every stage writes the same optimizer parts and gives the bits of the others, so all are compared
# with the ZeRO-1 reference. ZeRO-3 writes the weights' parts first (model.part_<r> before
# optimizer.part_<r>): N drawn from the reference's optimizer writes falls in both kinds of file.
ZERO_STAGES = (("dist.zero=3",), ("dist.zero=2",), ("dist.zero=1",))
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
        self.kill_window = args.kill_window
        self.verbose = args.verbose
        self.part_faults = 0  # kill_part faults so far (their ZeRO stage in turn)
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

    def launch_cmd(self, run, run_id, fault=None, rank=None, extra=()):
        # Both ranks are fault_trainer (its journal gives the run's durable steps); `fault` applies to
        # rank `rank` only. Each rank counts its calls in counts.<rank>.
        cmd = [f"{self.bin}/launch", "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
               "--run-id", run_id, "--log-dir", os.path.join(run, "launch_logs"),
               "--", f"{self.bin}/fault_trainer", "--journal", os.path.join(run, "journal"),
               "--counts", os.path.join(run, "counts.%RANK%")]
        if fault:
            cmd += ["--fault", fault, "--fault-rank", str(rank)]
        return cmd + ["--", self.config, *overrides(self.data, run, extra)]

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
    def read(path):
        try:
            with open(path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def reference(self, name, cmd_of, log_of):
        """The uninterrupted run; "train_seconds": from its first logged step to its exit (the span
        kill_time/kill_rank draw their moment from)."""
        run = os.path.join(self.work, name)
        p = self.start(cmd_of(run), run, 0)
        first = wait_first_step(p, log_of(run))
        try:
            rc = p.wait(600)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            rc = "timeout"
        end = time.time()
        if rc != 0 or first is None:
            sys.exit(f"fault_matrix: the uninterrupted run {name} failed ({rc}):\n" +
                     self.read(os.path.join(run, "attempt_0.out"))[-3000:])
        def counts(path):
            return {k: int(v) for k, v in (kv.split("=") for kv in self.read(path).split())}
        launched = name.startswith("ref_launch")
        return {"losses": self.losses(run), "weights": self.weights(run), "train_seconds": end - first,
                "counts": {} if launched else counts(os.path.join(run, "counts")),
                "rank_counts": [counts(os.path.join(run, f"counts.{r}")) for r in range(2)] if launched else []}

    # ---- evidence ---------------------------------------------------------------------------
    @staticmethod
    def journal(run):
        """The run's journal (fault_fs.h): one event per line, in the order they happened."""
        try:
            with open(os.path.join(run, "journal")) as f:
                return [line.rstrip("\n") for line in f]
        except OSError:
            return []

    @staticmethod
    def starts(lines):
        """[(index, {"pid", "rank", "run_id", "restart"})] of the journal's "start" lines."""
        out = []
        for i, line in enumerate(lines):
            if line.startswith("start "):
                out.append((i, dict(kv.split("=", 1) for kv in line.split()[1:])))
        return out

    @staticmethod
    def durable_before(lines, index):
        """The newest checkpoint step journalled durable in lines[:index] (0: none)."""
        steps = [int(m.group(1)) for line in lines[:index] for m in [re.match(r"durable .*/step_(\d+)$", line)] if m]
        return max(steps, default=0)

    def status(self, run):
        """meta.json's status: "running" from the start, "completed" once the run is done."""
        try:
            with open(os.path.join(run, "meta.json")) as f:
                return json.load(f).get("status", "")
        except (OSError, ValueError):
            return ""

    def resume_checks(self, run, outputs):
        """Data lost, measured for every process the journal saw start: each must resume from the
        newest checkpoint journalled durable before it started (or later), and no process may find a
        committed checkpoint that does not verify. outputs(start) -> the text that process logged
        (None when it is not a process that resumes: ranks other than 0). Returns (lost, detail)."""
        lines = self.journal(run)
        lost, notes = False, []
        for index, st in self.starts(lines):
            out = outputs(st)
            if out is None:
                continue
            durable = self.durable_before(lines, index)
            m = re.search(r"resumed from \S+ at step (\d+)", out)
            resumed = int(m.group(1)) if m else 0
            bad = [b.group(1) for b in re.finditer(r"checkpoint (\S+) did not verify", out)]
            if resumed < durable:
                lost = True
                notes.append(f"pid {st['pid']} resumed at {resumed} < durable {durable}")
            elif durable:
                notes.append(f"resumed at {resumed} (durable {durable})")
            if bad:
                lost = True
                notes.append(f"pid {st['pid']} found damaged: {' '.join(b.replace(run + '/', '') for b in bad)}")
        return lost, notes

    # ---- one fault ------------------------------------------------------------------------------
    def inject(self, i, kind, rng, ref, ref_launch, ref_zero=None):
        """One fault, then restarts until exit 0. Injected only with evidence from the process under
        test: the journal's "injected" line (file-system faults, written by the process as the fault
        fires), or a SIGKILL that killed a live process of a run not yet completed (kill_time: its exit
        status and meta.json; kill_rank: the launcher's report of the rank's death)."""
        run = os.path.join(self.work, f"f{i:03d}_{kind}")
        launch = kind in LAUNCHED
        base = {"kill_rank": ref_launch, "kill_part": ref_zero}.get(kind, ref)
        fault, fault_rank, extra_launch = None, None, ()  # kill_part: the fault of one rank, ZeRO-1
        pids = {}  # pid of each single-rank attempt -> its output file
        run_ids = []  # launch: the run id of each attempt (one launcher each)
        injected, why = True, ""

        def launch_attempt(attempt):
            run_ids.append(f"fm{os.getpid()}x{i}a{attempt}")
            return self.start(self.launch_cmd(run, run_ids[-1], fault, fault_rank, extra_launch), run, attempt)

        def trainer_attempt(cmd, attempt):
            p = self.start(cmd, run, attempt)
            pids[str(p.pid)] = os.path.join(run, f"attempt_{attempt}.out")
            return p

        def wait(p):
            try:
                return p.wait(600)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
                return "timeout"

        if kind in ("kill_time", "kill_rank"):
            # The moment: after a step drawn uniformly from 1..STEPS has been logged, a fraction of the
            # uninterrupted run's mean step time (its span from the first logged step to its exit,
            # over STEPS) drawn from --kill-window: anchored to this run's own progress, so the
            # machine's load does not push the kill past the end.
            lo, hi = self.kill_window
            at = rng.randint(1, STEPS)
            delay = rng.uniform(lo, hi) * base["train_seconds"] / STEPS
            detail = f"{delay:.2f} s after step {at}"
            p = launch_attempt(1) if launch else trainer_attempt(self.trainer_cmd(run), 1)
            first_log = (os.path.join(run, "launch_logs", run_ids[0], "attempt_0", "rank_0.log") if launch
                         else os.path.join(run, "attempt_1.out"))
            try:
                if wait_first_step(p, first_log, step=at) is None:
                    raise ChildProcessError
                p.wait(delay)
                injected, why = False, f"the run ended (exit {p.returncode}) before the signal"
            except ChildProcessError:
                injected, why = False, f"the run ended (exit {p.returncode}) before step {at}"
            except subprocess.TimeoutExpired:
                if launch:
                    victims = children(p.pid)
                    if not victims:
                        injected, why = False, "no rank was running"
                    else:
                        victim = rng.choice(victims)
                        rank = environ(victim).get("RANK", "?")
                        before = self.status(run)
                        os.kill(victim, signal.SIGKILL)
                        detail += f", rank {rank} pid {victim}"
                        if before == "completed":
                            injected, why = False, "the run had completed before the signal"
                else:
                    os.kill(p.pid, signal.SIGKILL)
            rc = wait(p)
            if injected:
                detail += f" (at {last_step(self.read(first_log))})"
            if injected and not launch:
                # The signal killed it (not an exit of its own) and the run was not done.
                if rc != -signal.SIGKILL:
                    injected, why = False, f"the trainer exited {rc} of its own"
                elif self.status(run) == "completed":
                    injected, why = False, "the run had completed before the signal"
            elif injected and launch:
                report = self.read(os.path.join(run, "attempt_1.out"))
                if not re.search(rf"attempt 0 failed: rank {rank} \(node \d+\) was killed by SIGKILL", report):
                    injected, why = False, f"the launcher does not report rank {rank} killed by SIGKILL"
            cmd = None
        elif kind == "kill_part":
            # One rank dies inside a sharded save: at its Nth write into its part file (once per run,
            # fault_fs.h), N drawn from that rank's writes into part files in the reference.
            fault_rank = rng.randint(0, 1)
            n = rng.randint(1, max(1, base["rank_counts"][fault_rank].get("part_writes", 1)))
            extra_launch = ZERO_STAGES[self.part_faults % len(ZERO_STAGES)]
            self.part_faults += 1
            fault = f"kill_part@{n}"
            detail = f"{extra_launch[0]} kill_part@{n} rank {fault_rank}"
            p = launch_attempt(1)
            rc = wait(p)
            fired = [line for line in self.journal(run) if line.startswith("injected ")]
            if fired:
                what = fired[0].split(" ", 2)[2].replace(run + "/", "")
                detail += f": {what}"
                report = self.read(os.path.join(run, "attempt_1.out"))
                if not re.search(rf"rank {fault_rank} \(node \d+\) was killed by SIGKILL", report):
                    injected, why = False, f"the launcher does not report rank {fault_rank} killed by SIGKILL"
            else:
                injected, why = False, f"rank {fault_rank} made fewer than {n} writes into part files (exit {rc})"
            cmd = None
        else:
            counter = {"kill_writer": None, "kill_rename": "renames", "kill_renamed": "renames", "enospc": "writes",
                       "eio": "writes", "fsync_eio": "syncs", "powercut": "calls"}[kind]
            n = rng.randint(1, 12) if counter is None else rng.randint(1, max(1, base["counts"][counter]))
            extra = ("checkpoint.async=true",) if kind == "kill_writer" else ()
            detail = f"{kind}@{n}"
            p = trainer_attempt(self.trainer_cmd(run, f"{kind}@{n}", extra), 1)
            rc = wait(p)
            fired = [line for line in self.journal(run) if line.startswith("injected ") and f" pid={p.pid} " in line]
            if fired:
                what = fired[0].split(" ", 2)[2].replace(run + "/", "")
                detail += f": {what} (at {last_step(self.read(pids[str(p.pid)]))})"
            else:
                injected, why = False, f"the trainer made fewer calls than {n} (exit {rc})"
            cmd = self.trainer_cmd(run, None, extra)
        attempts = [rc]
        while rc != 0 and len(attempts) < MAX_ATTEMPTS:
            attempt = len(attempts) + 1
            p = launch_attempt(attempt) if launch else trainer_attempt(cmd or self.trainer_cmd(run), attempt)
            rc = wait(p)
            attempts.append(rc)

        def outputs(st):
            if st["rank"] == "-":
                return self.read(pids.get(st["pid"], ""))
            if st["rank"] != "0":
                return None
            return self.read(os.path.join(run, "launch_logs", st["run_id"], f"attempt_{st['restart']}", "rank_0.log"))

        lost, notes = self.resume_checks(run, outputs)
        if notes:
            detail += ", " + ", ".join(notes)
        recovered = rc == 0
        identical = recovered and self.losses(run) == base["losses"] and self.weights(run) == base["weights"]
        row = {"i": i, "kind": kind, "detail": detail, "injected": injected, "why": why, "attempts": attempts,
               "recovered": injected and recovered, "identical": injected and identical, "lost": lost}
        good = (not injected or (recovered and identical)) and not lost
        if self.verbose or not good:
            state = (f"recovered={recovered} identical={identical}" if injected else f"NOT INJECTED ({why})")
            print(f"  fault {i:3d} {kind:12s} {detail}: exits {attempts} {state} data_lost={lost}", flush=True)
        if good and not self.keep:
            shutil.rmtree(run, ignore_errors=True)
        return row


def wait_first_step(p, log, step=None, timeout=600):
    """Waits until `log` shows a training step (`step`, or any): its time, or None when p exited first."""
    pattern = re.compile(r"\bstep\s+" + (str(step) if step else r"\d+") + r"/\d+ \|")
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            with open(log, errors="replace") as f:
                if pattern.search(f.read()):
                    return time.time()
        except OSError:
            pass
        if p.poll() is not None:
            return None
        time.sleep(0.02)
    return None


def last_step(out):
    """Where a process was: the last training step its output logged ("start-up" before the first)."""
    steps = re.findall(r"\bstep\s+(\d+)/\d+ \|", out)
    return f"step {steps[-1]}" if steps else "start-up"


def environ(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return dict(kv.split("=", 1) for kv in f.read().decode(errors="replace").split("\0") if "=" in kv)
    except OSError:
        return {}


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
    ap.add_argument("--kill-window", default="0,1", metavar="LO,HI",
                    help="kill_time/kill_rank: the signal comes LO..HI mean step times (of the uninterrupted "
                         "run) after a step drawn from 1..%d is logged (e.g. 100,200: after the end, "
                         "reported as not injected)" % STEPS)
    ap.add_argument("--work", default=None, help="parent of the scratch directory (default $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep every run directory")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per fault")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        sys.exit(f"fault_matrix: unknown kind(s) {bad}; known: {KINDS}")
    try:
        args.kill_window = tuple(float(x) for x in args.kill_window.split(","))
        assert len(args.kill_window) == 2 and 0 <= args.kill_window[0] <= args.kill_window[1]
    except (ValueError, AssertionError):
        sys.exit(f"fault_matrix: --kill-window: expected LO,HI with 0 <= LO <= HI; got '{args.kill_window}'")
    m = Matrix(args)
    t0 = time.time()
    try:
        ref = m.reference("ref", lambda run: m.trainer_cmd(run), lambda run: os.path.join(run, "attempt_0.out"))
        ref_id = f"fm{os.getpid()}ref"
        ref_launch = m.reference("ref_launch", lambda run: m.launch_cmd(run, ref_id),
                                 lambda run: os.path.join(run, "launch_logs", ref_id, "attempt_0", "rank_0.log")) \
            if "kill_rank" in kinds else None
        zero_id = f"fm{os.getpid()}refzero"
        ref_zero = m.reference("ref_launch_zero", lambda run: m.launch_cmd(run, zero_id, extra=ZERO),
                               lambda run: os.path.join(run, "launch_logs", zero_id, "attempt_0", "rank_0.log")) \
            if "kill_part" in kinds else None
        print(f"fault_matrix: uninterrupted runs train for {ref['train_seconds']:.1f} s (1 rank)"
              + (f", {ref_launch['train_seconds']:.1f} s (2 ranks)" if ref_launch else "")
              + (f", {ref_zero['train_seconds']:.1f} s (2 ranks, ZeRO-1; part writes per rank "
                 f"{[c.get('part_writes') for c in ref_zero['rank_counts']]})" if ref_zero else "")
              + f"; fs calls {ref['counts']}", flush=True)
        rng = random.Random(args.seed)
        rows = [m.inject(i, kinds[i % len(kinds)], rng, ref, ref_launch, ref_zero) for i in range(args.faults)]
    finally:
        m.close()
    print_table(rows, kinds, time.time() - t0)
    failures = []
    for r in rows:
        if r["injected"] and not (r["recovered"] and r["identical"]):
            failures.append(f"fault {r['i']} ({r['kind']}) not recovered byte-identically")
        if r["lost"]:
            failures.append(f"fault {r['i']} ({r['kind']}) lost data")
    for k in kinds:
        rs = [r for r in rows if r["kind"] == k]
        if rs and not any(r["injected"] for r in rs):
            failures.append(f"{k}: none of its {len(rs)} faults was injected (nothing measured)")
    for f in failures:
        print(f"fault_matrix: FAIL: {f}")
    sys.exit(1 if failures else 0)


def print_table(rows, kinds, seconds):
    """Per kind: faults drawn, injected (with evidence), not injected (the run ended first, or the
    Nth call never came: nothing to recover from, never counted below), and of the injected ones:
    recovered, byte-identical; data lost over every run."""
    cols = ["faults", "injected", "not injected", "recovered", "byte-identical", "data lost"]
    print("\n" + f"{'fault':14s}" + "".join(f"{c:>{max(len(c), 5) + 2}s}" for c in cols))
    for k in kinds + ["total"]:
        rs = rows if k == "total" else [r for r in rows if r["kind"] == k]
        c = [len(rs), sum(r["injected"] for r in rs), sum(not r["injected"] for r in rs),
             sum(r["recovered"] for r in rs), sum(r["identical"] for r in rs), sum(r["lost"] for r in rs)]
        print(f"{k:14s}" + "".join(f"{v:>{max(len(col), 5) + 2}d}" for v, col in zip(c, cols)))
    print(f"({seconds:.0f} s)")


if __name__ == "__main__":
    main()
