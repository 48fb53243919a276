"""The quick tier's measured edge: tests that took longer than :data:`QUICK_LIMIT` are marked ``slow``.

``tests/durations.json`` holds each test's seconds (setup + call + teardown) from a full run of the suite on the
2-core machine the project tests on. ``conftest.py`` marks every test listed at or above :data:`QUICK_LIMIT` as
``slow``, beside the tests marked in code, so ``scripts/test.sh --quick`` (``-m "not slow"``) leaves them out.
Refresh the file after a full run with durations::

    python -m pytest -q -n auto --durations=0 > /tmp/full.txt
    python tests/helpers/durations.py /tmp/full.txt
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

DURATIONS = Path(__file__).resolve().parents[1] / "durations.json"
QUICK_LIMIT = 0.7  # seconds (on the busy 2-core machine): above it a test is left out of the quick tier
_LINE = re.compile(r"\s*([\d.]+)s (call|setup|teardown)\s+(.+?)\s*$")


def slow_tests() -> set[str]:
    """The node ids measured at or above :data:`QUICK_LIMIT` (none when the file is absent)."""
    if not DURATIONS.is_file():
        return set()
    return {test for test, seconds in json.loads(DURATIONS.read_text()).items() if seconds >= QUICK_LIMIT}


def main(report: str) -> None:
    """Write ``durations.json`` from a pytest ``--durations=0`` output: the tests that took half a second or more."""
    seconds: dict[str, float] = defaultdict(float)
    for line in Path(report).read_text().splitlines():
        match = _LINE.match(line)
        if match:
            seconds[match.group(3)] += float(match.group(1))
    kept = {test: round(s, 2) for test, s in sorted(seconds.items()) if s >= 0.5}
    DURATIONS.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
    slow = sum(s >= QUICK_LIMIT for s in kept.values())
    print(f"{DURATIONS}: {len(kept)} tests of 0.5 s or more, {slow} of them slow")


if __name__ == "__main__":
    main(sys.argv[1])
