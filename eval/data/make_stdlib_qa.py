"""Build eval/data/stdlib-qa.jsonl: extractive QA over held-out standard-library source files.

Each example's context is the start of a held-out stdlib file (see ctxext/scoring/texts.py); the
question asks for the value assigned to a module-level name somewhere in it; the answer is that value.
Answers sit at different depths of the contexts, and contexts have different lengths. Regenerate with
``python eval/data/make_stdlib_qa.py`` (deterministic for a given Python version).
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

from ctxext.models.builtin import stdlib_files, stdlib_split

ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) = ((?:'[^'\n]{1,30}'|\"[^\"\n]{1,30}\"|\d{1,8}))\s*$", re.M)


def main(out: Path = Path(__file__).with_name("stdlib-qa.jsonl"), n: int = 24) -> None:
    """Write up to ``n`` examples to ``out``."""
    rng = random.Random(0)
    rows = []
    for path in stdlib_files(min_bytes=3000):
        if stdlib_split(path) != "heldout":
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        size = rng.choice([1500, 3000, 6000, 12000])
        context = text[:size]
        found = [m for m in ASSIGN.finditer(context)]
        names = [m.group(1) for m in found]
        found = [m for m in found if names.count(m.group(1)) == 1 and "\\" not in m.group(2)]
        if not found:
            continue
        m = rng.choice(found)
        rows.append(
            {
                "context": context,
                "question": f"What value is assigned to {m.group(1)}?",
                "answers": {"text": [m.group(2).strip("'\"")], "answer_start": [m.start(2)]},
                "source": path.name,
            }
        )
        if len(rows) >= n:
            break
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} examples to {out}")


if __name__ == "__main__":
    main()
