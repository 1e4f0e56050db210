"""Sums up one bench/gpu.sh run: prints result.json (one JSON object) from the results folder.

usage: python3 bench/gpu_summary.py RESULTS_DIR

What it reads (each optional: a phase skipped or cut short for time is simply absent):
  phases.tsv                each phase's status (ok, failed, skipped (time), cut (time)) and seconds
  settings.json             STEPS: the timed steps of each A/B run (records after them, the profiled
                            steps, are left out)
  <variant>_metrics.jsonl   the trainer's records of each A/B variant (all_on, all_off, no_<switch>,
                            residual, act_ckpt); the first window (start-up) is left out of every mean
  peer_eager.log, peer_compile.log   bench/peers/gpt_torch.py's JSON line
  traces/*.top.json         top kernels by GPU time (the trainer's log.profile_steps summary and the
                            peer's --trace summary, one format)
  parity_{false,true}_metrics.jsonl  train.bf16_residual off / on, the same run otherwise
  smoke.json                the smoke phase's verdict
  ckpt_dropout_{none,block}_metrics.jsonl  activation checkpointing block vs none with dropout
What it writes: the phases (status and seconds; which were skipped for time, which failed); tokens/s, step time, MFU and peak memory per variant; each switch's worth (tokens/s
with the switch on over tokens/s with it off, the others on); the default the numbers pick for
each switch (on when it is worth at least 1%); every variant's and peer's ratio to the peer's
torch.compile and eager tokens/s; the top 10 kernels side by side; the parity verdict.
"""
import glob
import json
import math
import os
import sys

R = sys.argv[1]
VARIANTS = ("all_on", "all_off", "no_fused_loss", "no_free_grads", "no_clip_in_step", "residual", "act_ckpt")
# switch -> (the variant without it, the key it sets)
SWITCHES = {"fused_loss": ("no_fused_loss", "train.fused_loss"), "free_grads": ("no_free_grads", "optim.free_grads"),
            "clip_in_step": ("no_clip_in_step", "optim.clip_in_step")}


def last_json(path):  # the last JSON object line of a log (stderr is mixed in)
    try:
        lines = open(path).read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def train_records(path):
    try:
        recs = [json.loads(l) for l in open(path) if l.strip()]
    except (OSError, ValueError):
        return []
    return [x for x in recs if x.get("kind") == "train"]


def mean(xs):
    xs = [x for x in xs if isinstance(x, (int, float)) and math.isfinite(x)]
    return sum(xs) / len(xs) if xs else None


def load_json(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return None


SETTINGS = load_json(f"{R}/settings.json") or {}


def phases():  # [(phase, status, seconds, note)] in the order they ran
    try:
        lines = open(f"{R}/phases.tsv").read().splitlines()[1:]
    except OSError:
        return []
    rows = []
    for line in lines:
        f = (line.split("\t") + ["", "", "", ""])[:4]
        rows.append((f[0], f[1], int(f[2]) if f[2].isdigit() else None, f[3]))
    return rows


def variant(name):
    recs = train_records(f"{R}/{name}_metrics.jsonl")[1:]  # the first window holds start-up
    if "steps" in SETTINGS:  # the steps profiled after the timed ones are no part of the means
        recs = [x for x in recs if x["step"] <= SETTINGS["steps"]]
    if not recs:
        return None
    rnd = lambda v, n: None if v is None else round(v, n)
    return {"windows": len(recs), "tokens_per_s": rnd(mean([x["tokens_per_s"] for x in recs]), 0),
            "step_ms": rnd(mean([x["step_ms"] for x in recs]), 2),
            "mfu_pct": rnd(mean([x.get("mfu_pct") for x in recs]), 1),
            "data_wait_pct": rnd(mean([x.get("data_wait_pct") for x in recs]), 3),
            "peak_mem_mb": max((x.get("mem_mb") or 0) for x in recs),
            "last_loss": recs[-1].get("loss")}


def top(path, n=10):
    try:
        t = json.load(open(path))
    except (OSError, ValueError):
        return None
    return {"device": t.get("device"), "window": t.get("window"), "total_us": t.get("total_us"),
            "top": [[k.get("name", "")[:90], k.get("pct"), k.get("calls"), k.get("total_us")] for k in t.get("top", [])[:n]]}


out = {}
ph = phases()
if ph:
    out["phases"] = [{"phase": p, "status": st, "s": sec, **({"note": n} if n else {})} for p, st, sec, n in ph]
    out["skipped_for_time"] = [p for p, st, _, _ in ph if st in ("skipped (time)", "cut (time)")]
    out["failed"] = [p for p, st, _, _ in ph if st == "failed"]
    out["seconds_used"] = sum(sec or 0 for _, _, sec, _ in ph)
out["settings"] = SETTINGS
for v in VARIANTS:
    r = variant(v)
    if r:
        out[v] = r
for name in ("peer_eager", "peer_compile"):
    p = last_json(f"{R}/{name}.log")
    if p:
        out[name] = {k: p.get(k) for k in ("tokens_per_s", "step_ms", "mfu_pct", "peak_mem_gib", "torch")}

ratios = {}
for who in VARIANTS + ("peer_eager",):
    for peer in ("peer_compile", "peer_eager"):
        if who == peer or who not in out or peer not in out:
            continue
        mine, theirs = out[who].get("tokens_per_s"), out[peer].get("tokens_per_s")
        if mine and theirs:
            ratios[f"{who}_vs_{peer}"] = round(mine / theirs, 3)
out["ratios"] = ratios

worth, picked = {}, {}
for sw, (without, key) in SWITCHES.items():
    if "all_on" in out and without in out:
        w = out["all_on"]["tokens_per_s"] / out[without]["tokens_per_s"]
        worth[sw] = round(w, 3)
        picked[key] = "on" if w >= 1.01 else "off (worth < 1%)"
if "all_on" in out and "all_off" in out:
    worth["all_switches"] = round(out["all_on"]["tokens_per_s"] / out["all_off"]["tokens_per_s"], 3)
if "all_on" in out and "residual" in out:
    worth["bf16_residual"] = round(out["residual"]["tokens_per_s"] / out["all_on"]["tokens_per_s"], 3)
if "all_on" in out and "act_ckpt" in out:  # a memory lever: what it saves and what it costs
    a, c = out["all_on"], out["act_ckpt"]
    out["act_ckpt_vs_all_on"] = {"tokens_per_s": round(c["tokens_per_s"] / a["tokens_per_s"], 3),
                                 "peak_mem": round(c["peak_mem_mb"] / a["peak_mem_mb"], 3) if a["peak_mem_mb"] else None}
out["switch_worth"] = worth  # tokens/s with the switch / without it (> 1: the switch helps)
out["defaults_picked"] = picked

tops = {}
for path in sorted(glob.glob(f"{R}/traces/*.top.json")):
    tops[os.path.basename(path)[: -len(".top.json")]] = top(path)
out["top_kernels"] = tops

off, on = train_records(f"{R}/parity_false_metrics.jsonl"), train_records(f"{R}/parity_true_metrics.jsonl")
if off and on:
    a, b = {x["step"]: x["loss"] for x in off}, {x["step"]: x["loss"] for x in on}
    steps = sorted(set(a) & set(b))
    ok = [s for s in steps if isinstance(a[s], float) and isinstance(b[s], float)]
    late = [s for s in ok if s > steps[-1] // 2]  # the curve after the first half: where it must agree
    dev = max((abs(a[s] - b[s]) / abs(a[s]) for s in late), default=None)
    out["parity"] = {"steps": steps, "loss_fp32_residual": [a[s] for s in steps],
                     "loss_bf16_residual": [b[s] for s in steps],
                     "max_rel_dev_second_half": None if dev is None else round(dev, 4),
                     "same_curve": dev is not None and dev < 0.02 and len(ok) == len(steps)}
out["smoke"] = last_json(f"{R}/smoke.json")
ck_none = train_records(f"{R}/ckpt_dropout_none_metrics.jsonl")
ck_block = train_records(f"{R}/ckpt_dropout_block_metrics.jsonl")
if ck_none or ck_block:  # block must rerun each block's forward with the same dropout masks and kernels
    loss = lambda recs: [x.get("loss") for x in recs]
    out["ckpt_dropout"] = {"steps": [len(ck_none), len(ck_block)],
                           "bit_identical": len(ck_none) == 10 and loss(ck_none) == loss(ck_block)}
print(json.dumps(out, indent=1))
