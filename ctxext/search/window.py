"""What a searched model costs inside the original window, measured as a paired statistic against the base.

A searched model has short factors 1, so inside its original window (sequences of at most ``L`` tokens)
transformers' ``longrope`` runs the original frequencies — but it multiplies cos / sin by
``attention_factor`` at every length, so any attention factor but 1 changes the model there too. The
in-window cost therefore depends on the attention factor alone, not on the long factors: it is measured
once per attention factor, on windows of ``L`` tokens, paired with the base on the same tokens
(:func:`ctxext.evaluation.stats.paired_ppl_ratio`, a bootstrap over windows).

:func:`attention_limit` uses it for ``--attention-factor search``: the largest attention factor on the
search's grid whose in-window cost is **admissible** (:func:`admissible`): not detectably above the base
(the paired 95 % interval reaches down to 1), or demonstrably within the tolerance (its upper end is at
most ``1 + tolerance``). With a tolerance of 0 only the first holds: "not detectably changed", which
depends on how many windows are measured (more windows detect smaller changes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

# Windows of L tokens for the in-window statistic (the first L tokens of each document long enough).
WINDOW_DOCS = 256


def doc_nll(model: torch.nn.Module, docs: list[list[int]]) -> np.ndarray:
    """``[docs, T − 1]`` token NLLs of documents of one length (token ``t`` at column ``t − 1``)."""
    from ctxext.evaluation.scoring import token_nll
    from ctxext.rope.runtime import reset_dynamic_rope

    rows = []
    per_batch = max(1, 16384 // len(docs[0]))
    for i in range(0, len(docs), per_batch):
        reset_dynamic_rope(model)
        rows.append(token_nll(model, torch.tensor(docs[i : i + per_batch], dtype=torch.long)).double().numpy())
    reset_dynamic_rope(model)
    return np.concatenate(rows)


def windows(tokenizer: Any, source: str, original_length: int, limit: int = WINDOW_DOCS) -> list[list[int]]:
    """The first ``original_length`` tokens of up to ``limit`` documents of ``source``."""
    from ctxext.search.objective import _documents

    return _documents(tokenizer, source, original_length, limit)


def paired_window_ratio(nll: np.ndarray, base_nll: np.ndarray) -> dict[str, Any]:
    """Paired in-window perplexity ratio ``ppl(model) / ppl(base)`` with its 95 % bootstrap interval.

    Args:
        nll: ``[windows, L − 1]`` token NLLs of the model.
        base_nll: the base's, on the same tokens.

    Returns:
        ``ratio``, ``ci_low``, ``ci_high``, ``p_value``, ``documents``, ``max_abs_nll_diff`` and
        ``includes_one`` (the interval contains 1: no detectable change).
    """
    from ctxext.evaluation.stats import paired_ppl_ratio

    counts = np.full(len(nll), nll.shape[1], dtype=np.float64)
    out: dict[str, Any] = dict(paired_ppl_ratio(nll.sum(axis=1), base_nll.sum(axis=1), counts))
    out["max_abs_nll_diff"] = float(np.abs(nll - base_nll).max()) if nll.size else 0.0
    if out["max_abs_nll_diff"] == 0.0:
        out.update({"ci_low": 1.0, "ci_high": 1.0, "p_value": 1.0})
    out["includes_one"] = bool(out["ci_low"] <= 1.0 <= out["ci_high"])
    return out


def admissible(stat: dict[str, Any], tolerance: float) -> bool:
    """An in-window cost is admissible when it is not detectable (``ci_low ≤ 1``) or within the tolerance.

    Args:
        stat: a :func:`paired_window_ratio` (``ci_low`` / ``ci_high`` of the ratio to the base).
        tolerance: the allowed increase (fraction) for the upper end of the interval.
    """
    return bool(stat["ci_low"] <= 1.0 or stat["ci_high"] <= 1.0 + tolerance)


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
