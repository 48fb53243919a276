"""Which needle forms the base model retrieves inside its own window: the needle objective's templates.

The needle objective scores how well an extension keeps retrieval working far beyond the original window.
A surface form that the *unextended* model cannot retrieve even inside its window says nothing about an
extension: its answer NLL is high for every candidate, and it only adds noise to the fitness. Measured on
the grown model (64-token window, 32 in-window probes per form): the code form ``KEY_xy = …`` 100 %,
``config['xy'] = …`` and the comment form 0 %, the prose form does not fit in 64 tokens — so three of the
four training forms were noise, and the search chose factors worse than llama3 on held-out needles.

So before a needle search, each training form is probed **inside the original window with the base model**
(teacher-forced, like the fitness) and only the forms it retrieves at least ``min_accuracy`` of the time
(:data:`~ctxext.tasks.forms.MIN_WINDOW_ACCURACY` by default, ``--min-form-accuracy``) are used, at the target
length, for the search and for the report's held-out objective. A real pretrained model retrieves every form and
keeps them all. The probes come from the same (training-split) source as the fitness set; the check itself (each
form's probes scored until its decision is certain) is :mod:`ctxext.tasks.forms`, which the adaptive stop shares.
"""

from __future__ import annotations

from typing import Any

from ctxext.errors import InputError
from ctxext.tasks.forms import (
    MIN_WINDOW_ACCURACY,
    PROBES_PER_DEPTH,
    FormCheck,
    check_form,
    kept_templates,
    summarize,
)


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
        One :class:`~ctxext.tasks.forms.FormCheck` per template, in order.
    """
    from ctxext.search.objective import SEARCH_DEPTHS, retrieval_set

    checks: list[FormCheck] = []
    for template in templates:
        try:
            probes = retrieval_set(tokenizer, source, original_length, SEARCH_DEPTHS, per_depth, seed, task, [template])
        except InputError:
            # The form's needle and question do not fit in the window: the base never saw it whole.
            checks.append(FormCheck(template, None, 0, False, per_depth * len(SEARCH_DEPTHS)))
            continue
        checks.append(check_form(model, template, probes.sequences, probes.spans, per_depth, min_accuracy))
    return checks


def usable_templates(
    checks: list[FormCheck], original_length: int, min_accuracy: float = MIN_WINDOW_ACCURACY
) -> list[int]:
    """The kept forms' templates (``min_accuracy`` is the threshold they were checked with, for the message).

    Raises:
        InputError: the base retrieves none of the forms inside its window (a needle objective would be noise).
    """
    kept = kept_templates(checks)
    if not kept:
        raise InputError(
            f"the base model retrieves none of the needle forms inside its own {original_length}-token window "
            f"({summarize(checks)}; at least {100 * min_accuracy:.0f} % needed), so a needle objective cannot "
            "tell good factors from bad ones. Use --objective far-ppl (or a lower --min-form-accuracy)."
        )
    return kept
