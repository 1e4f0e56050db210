"""Where a CPU training step's time goes, from a trainer Chrome trace (log.profile_steps), and the
trainer's step beside the peer's (--compare).

usage: /usr/bin/python3 bench/profile_breakdown.py TRACE STEPS STEP_MS FLOPS_PER_STEP ROOF_FLOPS
       /usr/bin/python3 bench/profile_breakdown.py --compare [--steps N] [--result RESULT] [--table OUT]
                                                   NAME=TRACE...
  TRACE           RUN_DIR/profile/steps_A-B.rank0.trace.json (LibTorch's profiler, one event per op):
                  the legacy recorder's event array (LibTorch 1.13) or Kineto's {"traceEvents": ...}
                  (2.x), of which the CPU ops are read (category cpu_op or user_annotation; Kineto's
                  own spans, such as "PyTorch Profiler (0)", and GPU or runtime events are left out)
  STEPS           steps the trace covers (B - A + 1)
  STEP_MS         the step time measured without the profiler (its own overhead is left out)
  FLOPS_PER_STEP  matmul FLOPs of one step (the trainer's FLOPs/token x tokens per step)
  ROOF_FLOPS      the machine's measured SGEMM FLOP/s
Prints one JSON object: each category's self time per step (an op's time minus the ops it calls)
as a share of the profiled step (one thread runs forward and backward on CPU), the matmul
kernels' own FLOP/s against the roof, and the time no op accounts for (the trainer's own loops:
AdamW, clipping, zeroing; the loader hand-off).
"""
import collections
import json
import sys

CATEGORIES = [  # first match wins; names are LibTorch op names without "aten::"
    ("matmul", ("mm", "addmm", "addmm_", "bmm", "baddbmm", "baddbmm_", "mv", "addmv", "dot")),
    ("gelu", ("gelu", "gelu_backward")),
    ("softmax", ("_softmax", "_softmax_backward_data", "softmax")),
    ("loss", ("log_softmax", "_log_softmax", "_log_softmax_backward_data", "nll_loss_forward",
              "nll_loss_backward", "nll_loss", "nll_loss_nd", "cross_entropy_loss")),
    ("layer_norm", ("native_layer_norm", "native_layer_norm_backward", "layer_norm")),
    ("embedding", ("embedding", "embedding_backward", "embedding_dense_backward", "index_select",
                   "index_add_", "index")),
    ("mask_dropout", ("masked_fill", "masked_fill_", "dropout", "native_dropout", "bernoulli_", "where")),
    ("copy_layout", ("copy_", "contiguous", "clone", "empty_like", "empty", "empty_strided", "zeros",
                     "zero_", "fill_", "select", "slice", "view", "reshape", "_reshape_alias", "as_strided",
                     "transpose", "t", "permute", "expand", "unsqueeze", "squeeze", "split", "chunk",
                     "narrow", "unsafe_split", "stack", "cat", "to", "_to_copy", "detach", "alias",
                     "unbind", "resize_", "set_", "sum_to_size")),
]

# The CPU ops of a trace: the legacy recorder's events have no category, Kineto's have these.
CPU_OP_CATEGORIES = ("cpu_op", "user_annotation")


def category(name):
    # The peer's (2.x) fused attention, fused AdamW and multi-tensor ops (clipping, AdamW foreach),
    # and torch.compile's regions (inductor's CPU kernels run inside them, unprofiled one by one).
    if "scaled_dot_product" in name:
        return "attention_fused"
    if name in ("aten::_fused_adamw_", "aten::_fused_adam_") or name.startswith("aten::_foreach_"):
        return "optimizer"
    if "Compiled" in name or "compiled" in name or "Torch-Compiled" in name or "inductor" in name.lower():
        return "compiled_region"
    if name in ("lm::gelu_tanh", "lm::gelu_tanh_backward"):  # the trainer's fused kernels (models/cpu_kernels.h)
        return "gelu"
    if name in ("lm::cross_entropy_sum", "lm::cross_entropy_sum_backward"):
        return "loss"
    if name in ("lm::causal_attention", "lm::causal_attention_backward"):
        return "attention_fused"  # its per-head sgemm calls and the causal softmax, not split apart
    op = name.split("::", 1)[1] if name.startswith("aten::") else None
    if op is None:
        return "autograd_other"  # autograd::engine nodes, record_function ranges
    for cat, ops in CATEGORIES:
        if op in ops:
            return cat
    return "elementwise_other"


def self_times(events):
    """Self time (us) per event name: duration minus the durations of events nested directly in it."""
    out = collections.Counter()
    by_tid = collections.defaultdict(list)
    for e in events:
        by_tid[e.get("tid")].append(e)
    for evs in by_tid.values():
        evs.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [end, name, child time]
        def pop():
            end, name, child, dur = stack.pop()
            out[name] += dur - child
        for e in evs:
            while stack and stack[-1][0] <= e["ts"]:
                pop()
            if stack:
                stack[-1][2] += e["dur"]
            stack.append([e["ts"] + e["dur"], e["name"], 0.0, e["dur"]])
        while stack:
            pop()
    return out


def breakdown(trace, steps):
    """(profiled step ms, {category: ms per step}, {op: ms per step}) of one trace."""
    data = json.load(open(trace))
    events = [e for e in (data["traceEvents"] if isinstance(data, dict) else data)
              if e.get("ph") == "X" and e.get("cat", "cpu_op") in CPU_OP_CATEGORIES]
    selfs = self_times(events)
    span_us = max(e["ts"] + e["dur"] for e in events) - min(e["ts"] for e in events)
    per_cat = collections.Counter()
    for name, us in selfs.items():
        per_cat[category(name)] += us
    step_ms = span_us / 1e3 / steps
    cat_ms = {c: us / 1e3 / steps for c, us in per_cat.items()}
    cat_ms["no_op"] = max(0.0, step_ms - sum(cat_ms.values()))
    return step_ms, cat_ms, {n: us / 1e3 / steps for n, us in selfs.items()}


def compare(argv):
    steps, result, table, sides = 3, None, None, []
    it = iter(argv)
    for arg in it:
        if arg == "--steps": steps = int(next(it))
        elif arg == "--result": result = json.load(open(next(it)))
        elif arg == "--table": table = next(it)
        elif "=" in arg: sides.append(arg.split("=", 1))
        else: sys.exit("profile_breakdown.py: unexpected argument %r" % arg)
    if len(sides) < 2: sys.exit("profile_breakdown.py: --compare needs at least two NAME=TRACE")
    out = {}
    for name, trace in sides:
        step_ms, cat_ms, ops = breakdown(trace, steps)
        unprof = None
        if result:
            tok = result["shape"]["batch"] * result["shape"]["seq"]
            tps = result["cpp_tokens_per_s"] if name == "trainer" else result["peers"].get(name, {}).get("tokens_per_s")
            unprof = round(1e3 * tok / tps, 1) if tps else None
        out[name] = {"profiled_step_ms": round(step_ms, 1), "step_ms_unprofiled": unprof,
                     "ms_per_step": {c: round(ms, 2) for c, ms in sorted(cat_ms.items(), key=lambda x: -x[1])},
                     "top_ops_ms_per_step": {n: round(ms, 2) for n, ms in sorted(ops.items(), key=lambda x: -x[1])[:12]}}
    print(json.dumps(out))
    if table:
        names = [n for n, _ in sides]
        cats = sorted({c for v in out.values() for c in v["ms_per_step"]}, key=lambda c: -max(v["ms_per_step"].get(c, 0) for v in out.values()))
        w = max(10, max(len(n) for n in names) + 2)
        lines = ["ms per step (self time of the ops in each category, %d profiled steps; the last columns: "
                 "the peer's minus the %s's)" % (steps, names[0]),
                 "%-20s" % "category" + "".join("%*s" % (w, n) for n in names) + "".join("%*s" % (w, "-" + names[0][:w - 3]) for n in names[1:])]
        def row(label, vals):
            base = vals[0]
            return "%-20s" % label + "".join("%*.1f" % (w, v) for v in vals) + "".join("%+*.1f" % (w, v - base) for v in vals[1:])
        for c in cats:
            lines.append(row(c, [out[n]["ms_per_step"].get(c, 0.0) for n in names]))
        lines.append(row("profiled step", [out[n]["profiled_step_ms"] for n in names]))
        if all(out[n]["step_ms_unprofiled"] for n in names):
            lines.append(row("unprofiled step", [out[n]["step_ms_unprofiled"] for n in names]))
        for n in names:
            lines.append("")
            lines.append("top ops by self time, %s (ms per step):" % n)
            lines += ["  %8.2f  %s" % (ms, op) for op, ms in list(out[n]["top_ops_ms_per_step"].items())[:10]]
        with open(table, "w") as f:
            f.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--compare":
        return compare(sys.argv[2:])
    trace, steps, step_ms, flops, roof = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    # no_op: time inside no op (the trainer's own loops: fused AdamW, clipping, zeroing; the loader hand-off).
    profiled_step_ms, cat_ms, op_ms = breakdown(trace, steps)
    # The fused attention's time counts as matmul time here (its products are most of it), so the
    # kernels' FLOP/s below is a lower bound when it runs.
    mm_ms = cat_ms.get("matmul", 0.0) + cat_ms.get("attention_fused", 0.0)
    print(json.dumps({
        "profiled_step_ms": round(profiled_step_ms, 1), "step_ms_unprofiled": round(step_ms, 1),
        "share_of_profiled_step": {c: round(ms / profiled_step_ms, 3) for c, ms in sorted(cat_ms.items(), key=lambda x: -x[1])},
        "matmul_kernels_gflops": round(flops / (mm_ms / 1e3) / 1e9, 1) if mm_ms else None,
        "matmul_kernels_over_roof": round(flops / (mm_ms / 1e3) / roof, 3) if mm_ms else None,
        "step_over_roof": round(flops / (step_ms / 1e3) / roof, 3),
        "top_ops_ms_per_step": {n: round(ms, 2) for n, ms in collections.Counter(op_ms).most_common(12)},
    }))


if __name__ == "__main__":
    main()
