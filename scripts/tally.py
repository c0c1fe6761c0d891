"""Add up pytest's closing lines: `tally.py SECONDS LOG...` prints one line for all the passes
of scripts/test, e.g. `scripts/test: 2712 passed, 0 failed, 41 skipped in 512 s`."""

import re
import sys
from collections import Counter

# pytest's last line, with or without -q: "=== 1 failed, 20 passed, 2 skipped in 3.10s (0:00:03) ==="
CLOSING = re.compile(r"^=*\s*(?P<counts>(?:\d+ \w+)(?:, \d+ \w+)*|no tests ran) in [\d.]+s\b")
COUNT = re.compile(r"(\d+) (\w+)")
PLURAL = {"error": "errors", "warning": "warnings"}


def closing_counts(text: str) -> Counter | None:
    """The counts of a pass's closing line, or None when the pass printed none (it crashed)."""
    for line in reversed(text.splitlines()):
        found = CLOSING.match(line.strip())
        if found:
            return Counter({PLURAL.get(word, word): int(n) for n, word in COUNT.findall(found["counts"])})
    return None


def main() -> int:
    seconds, logs = sys.argv[1], sys.argv[2:]
    total: Counter = Counter()
    missing = []
    for path in logs:
        with open(path, encoding="utf-8", errors="replace") as log:
            counts = closing_counts(log.read())
        if counts is None:
            missing.append(path)
        else:
            total += counts
    parts = [f"{total['passed']} passed", f"{total['failed']} failed"]
    if total["errors"]:
        parts.append(f"{total['errors']} error" + ("s" if total["errors"] > 1 else ""))
    parts.append(f"{total['skipped']} skipped")
    parts += [f"{total[word]} {word}" for word in ("xfailed", "xpassed") if total[word]]
    line = f"scripts/test: {', '.join(parts)} in {seconds} s"
    if missing:
        line += f" (no closing line in {', '.join(missing)})"
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
