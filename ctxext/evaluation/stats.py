"""Confidence intervals: bootstrap over documents for perplexities, Wilson for accuracies.

With ~20 documents, perplexity differences of a few percent are noise; every number in a report
carries a 95 % interval so a reader can see that.
"""

from __future__ import annotations

import math

import numpy as np

CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 1000


def _weights(n_docs: int, resamples: int, seed: int) -> np.ndarray:
    # Document resampling with replacement as multinomial counts: one matrix product per statistic.
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=resamples).astype(np.float64)


def bootstrap_nll(
    nll_sums: np.ndarray, counts: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95 % bootstrap interval of the token-weighted mean NLL, resampling documents.

    Args:
        nll_sums: per-document sums of token NLLs.
        counts: per-document numbers of scored tokens.
        resamples: bootstrap resamples.
        seed: RNG seed (the same seed resamples the same documents for every statistic).

    Returns:
        ``(low, high)`` of the mean NLL; both equal the point estimate with a single document.
    """
    nll_sums = np.asarray(nll_sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if len(nll_sums) == 0:
        return math.nan, math.nan
    if len(nll_sums) == 1:
        value = float(nll_sums[0] / counts[0])
        return value, value
    w = _weights(len(nll_sums), resamples, seed)
    stats = (w @ nll_sums) / np.maximum(w @ counts, 1e-12)
    alpha = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(stats, [alpha, 100 - alpha])
    return float(low), float(high)


def bootstrap_mean_diff(
    a_sums: np.ndarray, b_sums: np.ndarray, counts: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> tuple[float, float]:
    """Paired 95 % bootstrap interval of ``mean(a) − mean(b)`` over the same tokens of the same documents.

    Args:
        a_sums: per-document NLL sums of the first scoring.
        b_sums: per-document NLL sums of the second scoring (same tokens).
        counts: per-document token counts.
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        ``(low, high)``.
    """
    diff = np.asarray(a_sums, dtype=np.float64) - np.asarray(b_sums, dtype=np.float64)
    return bootstrap_nll(diff, counts, resamples, seed)


def ppl_entry(nll_sums: np.ndarray, counts: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> dict:
    """A perplexity result with its interval: ``ppl, nll, tokens, documents, ci_low, ci_high``.

    Args:
        nll_sums: per-document NLL sums.
        counts: per-document token counts.
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        The JSON-ready entry (``ci_low`` / ``ci_high`` bound the perplexity).
    """
    nll_sums = np.asarray(nll_sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    tokens = int(counts.sum())
    if tokens == 0:
        return {"ppl": None, "nll": None, "tokens": 0, "documents": 0, "ci_low": None, "ci_high": None}
    nll = float(nll_sums.sum() / tokens)
    low, high = bootstrap_nll(nll_sums, counts, resamples, seed)
    return {
        "ppl": math.exp(nll),
        "nll": nll,
        "tokens": tokens,
        "documents": int(len(counts)),
        "ci_low": math.exp(low),
        "ci_high": math.exp(high),
    }


def wilson_interval(correct: int, total: int, z: float = 1.959964) -> tuple[float, float]:
    """95 % Wilson score interval of a binomial proportion (sound at 0 %, 100 % and few trials).

    Args:
        correct: successes.
        total: trials.
        z: the normal quantile (1.96 for 95 %).

    Returns:
        ``(low, high)``; ``(nan, nan)`` for no trials.
    """
    if total == 0:
        return math.nan, math.nan
    p = correct / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)
