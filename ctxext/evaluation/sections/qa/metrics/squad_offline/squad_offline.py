"""SQuAD-style exact match and F1, as an ``evaluate`` metric module that loads offline.

``evaluate.load("squad")`` fetches its script from the Hub; this module ships with ctxext and is loaded
by path (``evaluate.load(".../squad_offline.py")``). Normalization is the official SQuAD v1.1 one:
lower-case, drop punctuation, drop the articles a / an / the, collapse whitespace. Each prediction is
scored against every reference answer and the best score counts. Scores are in percent, like
``evaluate``'s ``squad`` metric; ``per_example=True`` also returns the per-example scores.
"""

from __future__ import annotations

import collections
import re
import string

import datasets
import evaluate

_DESCRIPTION = "SQuAD v1.1 exact match and F1 (official normalization), offline."
_KWARGS = """
Args:
    predictions: list of predicted answer strings.
    references: list of lists of reference answer strings.
    per_example: also return per-example ``exact_match_per_example`` and ``f1_per_example`` (0/100 scale).
Returns:
    exact_match: percentage of predictions equal to a reference after normalization.
    f1: mean token-level F1 (best over references), in percent.
"""


def normalize_answer(text: str) -> str:
    """Lower-case, remove punctuation, articles and extra whitespace (official SQuAD v1.1)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, reference: str) -> float:
    """1.0 when the normalized strings are equal."""
    return float(normalize_answer(prediction) == normalize_answer(reference))


def f1(prediction: str, reference: str) -> float:
    """Token-level F1 of the normalized strings."""
    pred = normalize_answer(prediction).split()
    ref = normalize_answer(reference).split()
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if not pred or not ref:
        return float(pred == ref)
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class SquadOffline(evaluate.Metric):
    """SQuAD exact match / F1 without a network."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="Rajpurkar et al. 2016, SQuAD: 100,000+ Questions for Machine Comprehension of Text",
            inputs_description=_KWARGS,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Sequence(datasets.Value("string"))}
            ),
        )

    def _compute(self, predictions, references, per_example: bool = False):  # noqa: D102
        ems, f1s = [], []
        for pred, refs in zip(predictions, references, strict=True):
            refs = list(refs) or [""]
            ems.append(100.0 * max(exact_match(pred, r) for r in refs))
            f1s.append(100.0 * max(f1(pred, r) for r in refs))
        n = max(1, len(ems))
        out: dict[str, float | list[float]] = {"exact_match": sum(ems) / n, "f1": sum(f1s) / n}
        if per_example:
            out["exact_match_per_example"] = ems
            out["f1_per_example"] = f1s
        return out
