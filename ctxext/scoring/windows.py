"""What a searched model costs inside the original window, measured as a paired statistic against the base.

A searched model has short factors 1, so inside its original window (sequences of at most ``L`` tokens)
transformers' ``longrope`` runs the original frequencies — but it multiplies cos / sin by
``attention_factor`` at every length, so any attention factor but 1 changes the model there too. The
in-window cost therefore depends on the attention factor alone, not on the long factors: it is measured
once per attention factor, on windows of ``L`` tokens, paired with the base on the same tokens
(:func:`ctxext.scoring.stats.paired_ppl_ratio`, a bootstrap over windows).

A cost is **admissible** (:func:`admissible`) when it is not detectably above the base (the paired 95 %
interval reaches down to 1), or demonstrably within a tolerance (its upper end is at most
``1 + tolerance``). With a tolerance of 0 only the first holds: "not detectably changed", which depends on
how many windows are measured (more windows detect smaller changes). The search bounds its attention factor
by it (:mod:`ctxext.search.attention`), calibration its temperature.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# Windows of L tokens for the in-window statistic (the first L tokens of each document long enough).
WINDOW_DOCS = 256


def doc_nll(model: torch.nn.Module, docs: list[list[int]]) -> np.ndarray:
    """``[docs, T − 1]`` token NLLs of documents of one length (token ``t`` at column ``t − 1``)."""
    from ctxext.rope.runtime import reset_dynamic_rope
    from ctxext.scoring.nll import token_nll

    rows = []
    per_batch = max(1, 16384 // len(docs[0]))
    for i in range(0, len(docs), per_batch):
        reset_dynamic_rope(model)
        rows.append(token_nll(model, torch.tensor(docs[i : i + per_batch], dtype=torch.long)).double().numpy())
    reset_dynamic_rope(model)
    return np.concatenate(rows)


def windows(tokenizer: Any, source: str, original_length: int, limit: int = WINDOW_DOCS) -> list[list[int]]:
    """The first ``original_length`` tokens of up to ``limit`` documents of ``source``."""
    from ctxext.scoring.texts import leading_tokens

    return leading_tokens(tokenizer, source, original_length, limit)


def paired_window_ratio(nll: np.ndarray, base_nll: np.ndarray) -> dict[str, Any]:
    """Paired in-window perplexity ratio ``ppl(model) / ppl(base)`` with its 95 % bootstrap interval.

    Args:
        nll: ``[windows, L − 1]`` token NLLs of the model.
        base_nll: the base's, on the same tokens.

    Returns:
        ``ratio``, ``ci_low``, ``ci_high``, ``p_value``, ``documents``, ``max_abs_nll_diff`` and
        ``includes_one`` (the interval contains 1: no detectable change).
    """
    from ctxext.scoring.stats import paired_ppl_ratio

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
