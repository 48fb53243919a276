r"""RULER's string-match scoring of generated answers (NVIDIA/RULER ``scripts/eval/synthetic/constants.py``).

A generated prediction is first cleaned as RULER's ``postprocess_pred`` does (strip; every control
character ``\x00``–``\x1f`` becomes a newline; strip again). Then, per sample, with ``refs`` the reference
strings (a needle's value, all values of a multi-value needle, the common words …) and matching
case-insensitive substring containment:

* ``string_match_all``: the fraction of references that appear in the prediction;
* ``string_match_part``: 1 if any reference appears, else 0.

A task's score is the mean over samples × 100, rounded to 2 decimals (RULER's summary number). RULER
scores its needle, variable-tracking and word-extraction tasks with ``all`` and its QA tasks with
``part``; a ctxext task names its metric (:attr:`ctxext.tasks.base.Task.metric`) and its reference strings
(:meth:`ctxext.tasks.base.Task.references`).

Pure Python (no torch), importable by any scorer that has predictions: the retrieval grid, the RULER
section, a harness bridge::

    from ctxext.scoring.string_match import score_predictions
    score_predictions(["The numbers are 123 and 456."], [["123", "456", "789"]], "all")  # 66.67
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from ctxext.errors import InputError

# RULER's per-task generation budget (``tokens_to_generate`` in scripts/data/synthetic/constants.py), for
# reference: ctxext generates the answer's own length plus a margin instead (see the evaluation docs).
RULER_TOKENS_TO_GENERATE = {
    "niah": 128,
    "variable_tracking": 30,
    "common_words_extraction": 120,
    "freq_words_extraction": 50,
    "qa": 32,
}

_CONTROL = re.compile(r"[\x00-\x1f]")


def postprocess_prediction(text: str) -> str:
    """RULER's ``postprocess_pred``: strip, turn control characters into newlines, strip again."""
    return _CONTROL.sub("\n", text.strip()).strip()


def sample_match_all(prediction: str, references: Sequence[str]) -> float:
    """The fraction (0–1) of ``references`` that occur in ``prediction``, case-insensitive."""
    if not references:
        raise InputError("string match: a sample needs at least one reference string")
    pred = prediction.lower()
    return sum(1.0 for r in references if r.lower() in pred) / len(references)


def sample_match_part(prediction: str, references: Sequence[str]) -> float:
    """1.0 if any of ``references`` occurs in ``prediction`` (case-insensitive), else 0.0."""
    if not references:
        raise InputError("string match: a sample needs at least one reference string")
    pred = prediction.lower()
    return 1.0 if any(r.lower() in pred for r in references) else 0.0


# metric name → per-sample function (a task's ``metric`` names one of these).
SAMPLE_METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "all": sample_match_all,
    "part": sample_match_part,
}


def sample_metric(metric: str) -> Callable[[str, Sequence[str]], float]:
    """The per-sample function of ``all`` / ``part`` (also accepted: ``string_match_all`` / ``string_match_part``).

    Raises:
        InputError: an unknown metric name.
    """
    key = metric.removeprefix("string_match_")
    if key not in SAMPLE_METRICS:
        raise InputError(f"string match metric {metric!r}: use all or part (string_match_all / string_match_part)")
    return SAMPLE_METRICS[key]


def score_predictions(predictions: Sequence[str], references: Sequence[Sequence[str]], metric: str = "all") -> float:
    """RULER's task score: the mean per-sample string match × 100, rounded to 2 decimals.

    Predictions are cleaned with :func:`postprocess_prediction` first (RULER cleans before scoring).

    Args:
        predictions: generated texts, one per sample.
        references: the reference strings of each sample.
        metric: ``all`` (``string_match_all``) or ``part`` (``string_match_part``).

    Returns:
        The score in percent (0–100).

    Raises:
        InputError: no predictions, mismatched lengths, an empty reference list or an unknown metric.
    """
    fn = sample_metric(metric)
    if not predictions:
        raise InputError("string match: no predictions to score")
    if len(predictions) != len(references):
        raise InputError(f"string match: {len(predictions)} predictions but {len(references)} reference lists")
    total = sum(fn(postprocess_prediction(p), r) for p, r in zip(predictions, references, strict=True))
    return round(total / len(predictions) * 100, 2)


def string_match_all(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's ``string_match_all`` (percent): per sample, the fraction of references found."""
    return score_predictions(predictions, references, "all")


def string_match_part(predictions: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """RULER's ``string_match_part`` (percent): per sample, 1 if any reference is found."""
    return score_predictions(predictions, references, "part")
