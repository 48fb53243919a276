"""The one match of a generated answer: cut at the first stop sequence, then equal to the answer after stripping.

ctxext's own greedy scoring of exported prompts and lm-evaluation-harness apply this same rule (lm-eval cuts
at the task's ``until`` and its ``exact_match`` ignores leading and trailing whitespace through the
``regexes_to_ignore`` the exported task files declare), so their outcomes compare trial for trial. It is stricter
than teacher-forced scoring (:mod:`ctxext.scoring.answers`, "the answer's tokens are the greedy
continuation"): text generated after the answer and before a stop sequence makes the answer wrong, as it does in
a harness.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

# What lm-eval's exact_match removes before comparing (the task files write the same patterns).
STRIP_PATTERNS = (r"^\s+", r"\s+$")


def cut_at_stop(text: str, until: Sequence[str]) -> str:
    """``text`` up to the first stop sequence, as lm-eval cuts a generation (each sequence in turn)."""
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text


def strip_answer(text: str) -> str:
    """``text`` without leading and trailing whitespace (the :data:`STRIP_PATTERNS`)."""
    for pattern in STRIP_PATTERNS:
        text = re.sub(pattern, "", text)
    return text


def answer_matches(generated: str, answer: str, until: Sequence[str] = ()) -> bool:
    """Whether a generation is the answer: cut at ``until``, then equal to ``answer`` after stripping both."""
    return strip_answer(cut_at_stop(generated, until)) == strip_answer(answer)
