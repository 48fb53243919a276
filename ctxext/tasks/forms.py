"""Which needle forms a model retrieves inside its own window: the check ``ctxext search`` and the adaptive stop share.

A key form the *unextended* model cannot retrieve even inside its window says nothing about an extension (every
candidate misses it) and is not a skill the fine-tune carries to a longer window (it has to teach it from nothing).
Measured on the grown models (64-token window): the code form ``KEY_xy = …`` 93–100 %, ``config['xy'] = …`` and
the comment form 0 %. So ``ctxext search`` scores its needle objective, and the adaptive stop
(:mod:`ctxext.training.probe`) its probe, only on the forms the base retrieves at least ``min_accuracy`` of the time
(:data:`MIN_WINDOW_ACCURACY` by default) inside its window. Each caller builds its probes from its own held-out text
(depth-major: a depth's probes together); this module scores and decides.

A form's probes are scored one at a time, one per depth in turn, and the check of a form ends as soon as its
decision is certain (enough retrieved to keep it, or too few left to reach the share): the decision is the one
all the probes would give, at a fraction of the cost where the answer is clear (on SmolLM2 each probe is a
forward of 8,192 tokens: half a minute on a CPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# A form is kept when the base retrieves at least this share of its in-window probes (the default).
MIN_WINDOW_ACCURACY = 0.5
# Probes per depth and form, at this many depths: 32 probes of the window's length each.
PROBES_PER_DEPTH = 4
WINDOW_DEPTHS = 8


@dataclass(frozen=True)
class FormCheck:
    """One surface form, probed inside the original window with the base model.

    Attributes:
        template: the task template's index.
        accuracy: the share of the scored probes retrieved; None when the form does not fit in the window.
        probes: how many probes were scored (fewer than ``planned`` when the decision was certain earlier).
        kept: whether the form is used.
        planned: how many probes the check had (a resumed search checks with as many again).
    """

    template: int
    accuracy: float | None
    probes: int
    kept: bool
    planned: int = 0


def check_form(
    model: Any,
    template: int,
    sequences: list[list[int]],
    spans: list[tuple[int, int]],
    per_depth: int,
    min_accuracy: float = MIN_WINDOW_ACCURACY,
    answer_only: bool = True,
) -> FormCheck:
    """Score one form's in-window probes until keeping it is certain either way.

    Args:
        model: the base model, running its original RoPE.
        template: the form's template index.
        sequences: the probes (depth-major, ``per_depth`` per depth), each one answer (a form that does not fit in
            the window is ``FormCheck(template, None, 0, False, planned)``, built by the caller).
        spans: each probe's answer span.
        per_depth: probes per depth.
        min_accuracy: the share of all the probes a form needs to be kept.
        answer_only: see :func:`ctxext.scoring.answers.score_answers` (False under FSDP).
    """
    correct, scored = _score_until_decided(model, sequences, spans, per_depth, min_accuracy, answer_only)
    planned = len(sequences)
    return FormCheck(template, correct / scored, scored, correct >= min_accuracy * planned, planned)


def _score_until_decided(
    model: Any,
    sequences: list[list[int]],
    spans: list[tuple[int, int]],
    per_depth: int,
    min_accuracy: float,
    answer_only: bool = True,
) -> tuple[int, int]:
    """``(retrieved, scored)``: probes scored one per depth in turn until keeping the form is certain either way."""
    from ctxext.scoring.answers import score_answers

    planned = len(sequences)
    depths = planned // per_depth
    # The set is depth-major (a depth's probes together); one probe per depth in turn spreads the early ones.
    order = [d * per_depth + trial for trial in range(per_depth) for d in range(depths)]
    correct = scored = 0
    for index in order:
        [result] = score_answers(model, [sequences[index]], [spans[index]], answer_only=answer_only)
        correct, scored = correct + int(result.correct), scored + 1
        if correct >= min_accuracy * planned or correct + planned - scored < min_accuracy * planned:
            break
    return correct, scored


def kept_templates(checks: list[FormCheck]) -> list[int]:
    """The kept forms' templates, in order."""
    return [c.template for c in checks if c.kept]


def summarize(checks: list[FormCheck]) -> str:
    """``form 0: 100 % of the first 16 probes, form 3: does not fit, …``: what the probes found, for messages."""
    return ", ".join(f"form {c.template}: {_found(c)}" for c in checks)


def _found(check: FormCheck) -> str:
    if check.accuracy is None:
        return "does not fit"
    early = f" of the first {check.probes} probes" if check.probes < check.planned else ""
    return f"{100 * check.accuracy:.0f} %{early}"


def describe(checks: list[FormCheck]) -> list[dict[str, Any]]:
    """The checks, JSON-ready (for logs, headers and reports)."""
    return [asdict(c) for c in checks]
