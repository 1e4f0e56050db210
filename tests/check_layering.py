#!/usr/bin/env python3
"""The dependency rule, enforced: common/ <- data/, models/ <- run/ <- trainer/ <- launch/, tools/.

Every project include ("folder/...") in a source file must point at its own top-level folder or
one the rule allows below it: run/ (the run contract: the run directory, the records, the config)
is what launch/ and tools/ share with the trainer, and they include nothing of trainer/. Torch-free
code stays so: nothing in common/ outside common/torch/, nothing in data/, run/, launch/ (the
launcher speaks c10d's store protocol itself) and tools/ includes a LibTorch header (<torch/...>,
<ATen/...>, <c10/...>) or common/torch/. Inside every folder, at every level, the
arrows between its parts (each subfolder, and the files at its own top as one more part) form no
cycle: a part that includes another part's header is below it, so trainer/step/ may include
trainer/optim/optimizer.h only while nothing under trainer/optim/ includes trainer/step/. Prints
each violation as FILE:LINE (a cycle: each of its arrows with one include that makes it) and exits
1 when there is any.
bench/ and tests/ may include anything. Usage: check_layering.py [REPO_ROOT]
"""
import os
import re
import sys

ALLOWED = {
    "common": {"common"},
    "data": {"common", "data"},
    "models": {"common", "models"},
    "run": {"common", "data", "models", "run"},
    "trainer": {"common", "data", "models", "run", "trainer"},
    "launch": {"common", "data", "models", "run", "launch"},
    "tools": {"common", "data", "models", "run", "tools"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<((?:torch|ATen|c10)/[^>]+)>')
# Folders that never see LibTorch (common/torch/ aside).
TORCH_FREE = ("common", "data", "run", "launch", "tools")


def violations(root):
    for top, allowed in ALLOWED.items():
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith((".h", ".cpp", ".cc", ".proto")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        rel = os.path.relpath(path, root)
                        free = [d for d in TORCH_FREE if rel.startswith(d + os.sep)]
                        torch_free = free and not rel.startswith(os.path.join("common", "torch") + os.sep)
                        sm = SYSTEM_INCLUDE.match(line)
                        if torch_free and (sm or re.match(r'^\s*#\s*include\s+"common/torch/', line)):
                            yield f"{rel}:{n}: {free[0]}/ is torch-free and may not include {sm.group(1) if sm else line.strip()}"
                        m = INCLUDE.match(line) or re.match(r'^\s*import\s+"([^"]+)"', line)
                        if not m:
                            continue
                        target = m.group(1).split("/")[0]
                        if "/" in m.group(1) and target in ALLOWED and target not in allowed:
                            rel = os.path.relpath(path, root)
                            yield f"{rel}:{n}: {top}/ may not include {m.group(1)} (allowed: {', '.join(sorted(allowed))})"


def part_of(path, level):
    """The part of folder `level` that `path` lies in: its subfolder's name, or "." for a file at
    the level's top; None when path is not under level."""
    parts, lp = path.split("/"), level.split("/")
    if parts[:len(lp)] != lp or len(parts) <= len(lp):
        return None
    rest = parts[len(lp):]
    return rest[0] if len(rest) > 1 else "."


def folder_cycles(root):
    """Cycles between the parts of each folder (Tarjan's strongly connected components per level)."""
    edges = {}  # level -> part -> {part: "file:line -> include"}
    for top in ALLOWED:
        for dirpath, _, names in os.walk(os.path.join(root, top)):
            for name in sorted(names):
                if not name.endswith((".h", ".cpp", ".cc")):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, root).replace(os.sep, "/")
                with open(path, encoding="utf-8") as f:
                    for n, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or "/" not in m.group(1):
                            continue
                        a, b = rel.split("/"), m.group(1).split("/")
                        k = 0  # the deepest folder both lie in
                        while k < min(len(a), len(b)) - 1 and a[k] == b[k]:
                            k += 1
                        if k == 0:
                            continue
                        level = "/".join(a[:k])
                        pa, pb = part_of(rel, level), part_of(m.group(1), level)
                        if pa and pb and pa != pb:
                            edges.setdefault(level, {}).setdefault(pa, {}).setdefault(pb, f"{rel}:{n} -> {m.group(1)}")
    for level in sorted(edges):
        graph = edges[level]
        index, low, stack, on, counter = {}, {}, [], set(), [0]

        def visit(v):
            index[v] = low[v] = counter[0]
            counter[0] += 1
            stack.append(v)
            on.add(v)
            for w in sorted(graph.get(v, {})):
                if w not in index:
                    yield from visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    yield comp

        for v in sorted(graph):
            if v not in index:
                for comp in visit(v):
                    arrows = [f"{level}/{a} -> {level}/{b} ({graph[a][b]})" for a in sorted(comp)
                              for b in sorted(graph[a]) if b in comp]
                    yield f"{level}/: a cycle between {', '.join(sorted(comp))}: " + "; ".join(arrows)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = list(violations(root)) + list(folder_cycles(root))
    for v in bad:
        print(v)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
