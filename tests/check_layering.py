#!/usr/bin/env python3
"""The dependency rule, enforced: common/ <- data/, models/ <- trainer/ <- launch/, tools/.

Every project include ("folder/...") in a source file must point at its own top-level folder or
one the rule allows below it. Torch-free code stays so: nothing in common/ outside common/torch/,
nothing in data/, launch/ (the launcher speaks c10d's store protocol itself) and tools/report/
includes a LibTorch header (<torch/...>, <ATen/...>, <c10/...>) or common/torch/. Prints each
violation as FILE:LINE and exits 1 when there is any.
bench/ and tests/ may include anything. Usage: check_layering.py [REPO_ROOT]
"""
import os
import re
import sys

ALLOWED = {
    "common": {"common"},
    "data": {"common", "data"},
    "models": {"common", "models"},
    "trainer": {"common", "data", "models", "trainer"},
    "launch": {"common", "data", "models", "trainer", "launch"},
    "tools": {"common", "data", "models", "trainer", "tools"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
SYSTEM_INCLUDE = re.compile(r'^\s*#\s*include\s+<((?:torch|ATen|c10)/[^>]+)>')
# Folders that never see LibTorch (common/torch/ aside).
TORCH_FREE = ("common", "data", "launch", os.path.join("tools", "report"))


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


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = list(violations(root))
    for v in bad:
        print(v)
    print(f"layering: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
