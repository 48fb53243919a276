"""Which needle forms the base model retrieves inside its own window: the needle objective's templates.

The needle objective scores how well an extension keeps retrieval working far beyond the original window.
A surface form that the *unextended* model cannot retrieve even inside its window says nothing about an
extension: its answer NLL is high for every candidate, and it only adds noise to the fitness. Measured on
the grown model (64-token window, 32 in-window probes per form): the code form ``KEY_xy = …`` 100 %,
``config['xy'] = …`` and the comment form 0 %, the prose form does not fit in 64 tokens — so three of the
four training forms were noise, and the search chose factors worse than llama3 on held-out needles.

So before a needle search, each training form is probed **inside the original window with the base model**
(teacher-forced, like the fitness) and only the forms it retrieves at least ``min_accuracy`` of the time
(:data:`MIN_WINDOW_ACCURACY` by default, ``--min-form-accuracy``) are used, at the target length, for the
search and for the report's held-out objective. A real pretrained model retrieves every form and keeps
them all. The probes come from the same (training-split) source as the fitness set.

A form's probes are scored one at a time, one per depth in turn, and the check of a form ends as soon as its
decision is certain (enough retrieved to keep it, or too few left to reach the share): the decision is the one
all the probes would give, at a fraction of the cost where the answer is clear (on SmolLM2 each probe is a
forward of 8,192 tokens: half a minute on a CPU).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ctxext.errors import InputError

# A form is kept when the base retrieves at least this share of its in-window probes (the default).
MIN_WINDOW_ACCURACY = 0.5
# Probes per depth and form (8 depths: 32 probes of L tokens each, a fraction of one fitness evaluation).
PROBES_PER_DEPTH = 4


@dataclass(frozen=True)
class FormCheck:
    """One surface form, probed inside the original window with the base model.

    Attributes:
        template: the task template's index.
        accuracy: the share of the scored probes retrieved; None when the form does not fit in the window.
        probes: how many probes were scored (fewer than ``planned`` when the decision was certain earlier).
        kept: whether the search uses the form.
        planned: how many probes the check had (a resumed search checks with as many again).
    """

    template: int
    accuracy: float | None
    probes: int
    kept: bool
    planned: int = 0


def check_forms(
    model: Any,
    tokenizer: Any,
    source: str,
    original_length: int,
    templates: list[int],
    seed: int,
    task: str = "needle",
    per_depth: int = PROBES_PER_DEPTH,
    min_accuracy: float = MIN_WINDOW_ACCURACY,
) -> list[FormCheck]:
    """Probe each form inside the original window with ``model`` (which must run its original RoPE).

    Args:
        model: the base model, unextended.
        tokenizer: its tokenizer.
        source: the haystack's data source (the fitness set's).
        original_length: the original window ``L`` (every probe is ``L`` tokens).
        templates: the forms to probe.
        seed: seeds the probes.
        task: the retrieval task.
        per_depth: probes per depth.
        min_accuracy: the in-window accuracy a form needs to be kept.

    Returns:
        One :class:`FormCheck` per template, in order.
    """
    from ctxext.search.objective import SEARCH_DEPTHS, retrieval_set

    checks: list[FormCheck] = []
    planned = per_depth * len(SEARCH_DEPTHS)
    for template in templates:
        try:
            probes = retrieval_set(tokenizer, source, original_length, SEARCH_DEPTHS, per_depth, seed, task, [template])
        except InputError:
            # The form's needle and question do not fit in the window: the base never saw it whole.
            checks.append(FormCheck(template, None, 0, False, planned))
            continue
        correct, scored = _score_until_decided(model, probes, per_depth, min_accuracy)
        checks.append(FormCheck(template, correct / scored, scored, correct >= min_accuracy * planned, planned))
    return checks


def _score_until_decided(model: Any, probes: Any, per_depth: int, min_accuracy: float) -> tuple[int, int]:
    """``(retrieved, scored)``: probes scored one per depth in turn until keeping the form is certain either way."""
    from ctxext.scoring.answers import score_answers

    planned = len(probes.sequences)
    depths = planned // per_depth
    # The set is depth-major (a depth's probes together); one probe per depth in turn spreads the early ones.
    order = [d * per_depth + trial for trial in range(per_depth) for d in range(depths)]
    correct = scored = 0
    for index in order:
        [result] = score_answers(model, [probes.sequences[index]], [probes.spans[index]])
        correct, scored = correct + int(result.correct), scored + 1
        if correct >= min_accuracy * planned or correct + planned - scored < min_accuracy * planned:
            break
    return correct, scored


def usable_templates(
    checks: list[FormCheck], original_length: int, min_accuracy: float = MIN_WINDOW_ACCURACY
) -> list[int]:
    """The kept forms' templates (``min_accuracy`` is the threshold they were checked with, for the message).

    Raises:
        InputError: the base retrieves none of the forms inside its window (a needle objective would be noise).
    """
    kept = [c.template for c in checks if c.kept]
    if not kept:
        raise InputError(
            f"the base model retrieves none of the needle forms inside its own {original_length}-token window "
            f"({summarize(checks)}; at least {100 * min_accuracy:.0f} % needed), so a needle objective cannot "
            "tell good factors from bad ones. Use --objective far-ppl (or a lower --min-form-accuracy)."
        )
    return kept


def summarize(checks: list[FormCheck]) -> str:
    """``form 0: 100 % of the first 16 probes, form 3: does not fit, …``: what the probes found, for messages."""
    return ", ".join(f"form {c.template}: {_found(c)}" for c in checks)


def _found(check: FormCheck) -> str:
    if check.accuracy is None:
        return "does not fit"
    early = f" of the first {check.probes} probes" if check.probes < check.planned else ""
    return f"{100 * check.accuracy:.0f} %{early}"


def describe(checks: list[FormCheck]) -> list[dict[str, Any]]:
    """The checks, JSON-ready (for the log's header and the report)."""
    return [asdict(c) for c in checks]
