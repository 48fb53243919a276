"""The range of the searched attention factor: the largest whose in-window cost is admissible.

For ``--attention-factor search``: attention factors ``1, 1 + step, …`` are measured on windows of the original
length, paired with the base (:func:`ctxext.scoring.windows.paired_window_ratio`), until one's cost is not
admissible (:func:`ctxext.scoring.windows.admissible`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ctxext.scoring.windows import WINDOW_DOCS, admissible, doc_nll, paired_window_ratio, windows


@dataclass
class AttentionLimit:
    """The range an attention-factor gene may take, and the measurements that set it.

    Attributes:
        low: 1 (no scaling).
        high: the largest admissible factor on the grid (``low`` when none above it is).
        tolerance: the allowed in-window perplexity increase (0.005 = 0.5 %), bounding the 95 % upper end.
        scan: ``{attention_factor, ratio, ci_low, ci_high}`` of every factor tried, in order.
    """

    low: float
    high: float
    tolerance: float
    scan: list[dict[str, float]] = field(default_factory=list)


def attention_limit(
    switch: Any,
    tokenizer: Any,
    source: str,
    target_length: int,
    ceiling: float,
    step: float,
    tolerance: float,
    long_factor: np.ndarray,
    n_windows: int = WINDOW_DOCS,
) -> AttentionLimit:
    """Scan attention factors ``1, 1 + step, …, ceiling`` upwards until one's in-window cost is not admissible.

    Args:
        switch: a :class:`~ctxext.search.apply.RopeSwitch` around the loaded model.
        tokenizer: its tokenizer.
        source: data of the windows (the search's training split: held-out files stay for the report).
        target_length: the target length (for the longrope plan; windows run with the short factors).
        ceiling: the largest attention factor considered (LongRoPE's ``√(1 + ln s / ln L)``).
        step: the grid step.
        tolerance: allowed in-window perplexity increase (fraction) for the upper end of the paired 95 %
            interval (:func:`admissible`).
        long_factor: any long factors (they do not act inside the window).
        n_windows: windows of ``L`` tokens measured.

    Returns:
        The :class:`AttentionLimit`.
    """
    original = switch.state.original_length
    docs = windows(tokenizer, source, original, n_windows)
    switch.restore()
    base = doc_nll(switch.model, docs)
    limit = AttentionLimit(low=1.0, high=1.0, tolerance=tolerance)
    n_steps = int(np.floor((ceiling - 1.0) / step + 1e-9))
    for k in range(1, n_steps + 1):
        factor = round(1.0 + k * step, 10)
        switch.use_factors(long_factor, target_length, factor)
        stat = paired_window_ratio(doc_nll(switch.model, docs), base)
        limit.scan.append(
            {"attention_factor": factor, "ratio": stat["ratio"], "ci_low": stat["ci_low"], "ci_high": stat["ci_high"]}
        )
        if not admissible(stat, tolerance):
            break
        limit.high = factor
    switch.restore()
    return limit
