"""Needle-to-question distances: the distributions training draws them from, and how they are measured.

The distance of a sample is counted in positions, from the first token of the needle (the insert placed
at the sample's depth) to the query position, the last token before the answer (the one that predicts the
answer's first token): ``positions[answer_start - 1] - positions[needle_start]``. Without PoSE that is a
token count; with PoSE it includes the skips.

A distribution is an inverse CDF on ``[0, 1)``: a draw ``u`` becomes the distance ``floor(F(u) · span)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ctxext.errors import InputError

# name -> inverse CDF on [0, 1). Adding a distribution is one entry here (the recipe key accepts it).
DISTRIBUTIONS: dict[str, Callable[[float], float]] = {
    # Every distance equally often.
    "uniform": lambda u: u,
    # Density rising linearly with the distance (CDF x²): each eighth k of the span holds (2k+1)/64 of
    # the samples, the last quarter 44 %; long-range retrieval is what an extension has to teach.
    "far": math.sqrt,
}

DESCRIPTIONS = {
    "uniform": "every distance equally often",
    "far": "density rising linearly with the distance (the last quarter of the span holds 44 %)",
}

# Where a needle sits once its distance is drawn (``data.task_position``). An evaluation at the target puts
# the needle at every depth of a full-length sample, so depth 100 there is a near needle after a long prefix;
# "packed" samples are only as long as their distance needs and never train that corner.
POSITIONS = {
    "packed": "as early as packing leaves it (near needles only in short samples)",
    "uniform": "the needle's position drawn uniformly over what the span leaves after its distance",
}

# The realised histogram is recorded in this many equal bins of the span.
BINS = 8


def expected_shares(kind: str, bins: int = BINS) -> list[float]:
    """The share of samples each of ``bins`` equal bins of the span should hold under ``kind``."""
    inverse = DISTRIBUTIONS[kind]
    # Invert numerically: the CDF at a bin edge is the u whose inverse reaches it (inverse CDFs are monotone).
    edges = [_cdf(inverse, k / bins) for k in range(bins + 1)]
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


def _cdf(inverse: Callable[[float], float], x: float) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if inverse(mid) < x else (lo, mid)
    return (lo + hi) / 2


def sample_distance(sample: Any, positions: Sequence[int] | None = None) -> int:
    """The needle-to-question distance of a :class:`ctxext.tasks.base.TaskSample`, in positions.

    Args:
        sample: the sample (its ``needle_span`` and ``answer_span``).
        positions: the sample's position ids, or ``None`` for ``0..len-1``.
    """
    if sample.needle_span is None:
        raise InputError(f"task {sample.task}: its samples have no insert, so they have no needle distance to train")
    query, needle = sample.answer_span[0] - 1, sample.needle_span[0]
    if positions is None:
        return query - needle
    return int(positions[query]) - int(positions[needle])


def histogram(distances: Sequence[int], span: int, bins: int = BINS) -> list[float]:
    """Percent of ``distances`` in each of ``bins`` equal bins of ``[0, span)`` (rounded to 0.1)."""
    counts = [0] * bins
    for d in distances:
        counts[min(bins - 1, max(0, d * bins // span))] += 1
    n = max(1, len(distances))
    return [round(100 * c / n, 1) for c in counts]
