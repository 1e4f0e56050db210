#!/usr/bin/env python3
"""docs/config.md's table of every key is `trainer --keys`, verbatim (issue 40 item 2: each key
described once, in the schema beside the struct that owns it; the page is generated from it).

  check_config_doc.py TRAINER REPO_ROOT           exit 1, with a diff, when the page differs
  check_config_doc.py TRAINER REPO_ROOT --write   rewrites the page's table from the binary
"""
import difflib
import subprocess
import sys

HEADING = "## Every key (generated from `trainer --keys`)"
NOTE = ("<!-- generated: python3 tests/check_config_doc.py build/bin/trainer . --write; "
        "a test (config_doc) fails when it differs from `trainer --keys` -->")


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    trainer, root = sys.argv[1], sys.argv[2]
    write = "--write" in sys.argv[3:]
    page = f"{root}/docs/config.md"
    keys = subprocess.run([trainer, "--keys"], check=True, capture_output=True, text=True).stdout
    text = open(page, encoding="utf-8").read()
    if HEADING not in text:
        print(f"config_doc: {page}: no heading '{HEADING}'", file=sys.stderr)
        return 1
    head, rest = text.split(HEADING, 1)
    # The section: the heading, the note, the fenced table; whatever follows the fence is kept.
    start = rest.find("```text\n")
    end = rest.find("```\n", start + 8) if start >= 0 else -1
    if start < 0 or end < 0:
        print(f"config_doc: {page}: no ```text table after '{HEADING}'", file=sys.stderr)
        return 1
    table = rest[start + 8:end]
    if write:
        new = head + HEADING + "\n\n" + NOTE + "\n\n```text\n" + keys + "```\n" + rest[end + 4:]
        with open(page + ".tmp", "w", encoding="utf-8") as f:
            f.write(new)
        import os
        os.replace(page + ".tmp", page)
        print(f"config_doc: {page} written ({keys.count(chr(10)) - 1} keys)")
        return 0
    if table != keys:
        sys.stdout.writelines(difflib.unified_diff(table.splitlines(True), keys.splitlines(True),
                                                   "docs/config.md", "trainer --keys"))
        print("config_doc: docs/config.md differs from `trainer --keys`; regenerate it with:\n"
              "  python3 tests/check_config_doc.py build/bin/trainer . --write")
        return 1
    print(f"config_doc: docs/config.md is `trainer --keys` ({keys.count(chr(10)) - 1} keys)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
