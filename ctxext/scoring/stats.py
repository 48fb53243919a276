"""Confidence intervals: bootstrap over documents for perplexities, Wilson for accuracies.

Documents differ far more from each other than two models differ on one document, so with ~20 documents an
unpaired perplexity interval is wide; whether a given difference is real is what the interval (and, between
models, the paired tests below) says, not a rule of thumb. Every number in a report carries a 95 % interval;
a difference whose interval includes zero is not shown to exist, and that is not evidence that it is absent.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 1000
# Up to this many units (documents) a paired comparison's p is the exact sign-flip test's: a bootstrap's normal
# approximation over a handful of documents reports p-values no such sample can support (1e-200 from 5).
EXACT_UNITS = 16


def _weights(n_docs: int, resamples: int, seed: int) -> np.ndarray:
    # Document resampling with replacement as multinomial counts: one matrix product per statistic.
    rng = np.random.default_rng(seed)
    return rng.multinomial(n_docs, np.full(n_docs, 1.0 / n_docs), size=resamples).astype(np.float64)


def _bootstrap_means(sums: np.ndarray, counts: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    # The one bootstrap: token-weighted means of resampled documents, one value per resample.
    w = _weights(len(sums), resamples, seed)
    return (w @ sums) / np.maximum(w @ counts, 1e-12)


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
    stats = _bootstrap_means(nll_sums, counts, resamples, seed)
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


def doc_ppl_entry(
    nll_sums: np.ndarray, counts: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """Per-document perplexities averaged with token weights (LongPPL's official aggregation), with its interval.

    ``Σ_d n_d · exp(s_d / n_d) / Σ_d n_d``: the reference code of Fang et al. (2024) aggregates LongPPL this way
    (weights: each document's key tokens) and plain perplexity likewise (weights: its tokens). By Jensen's
    inequality it is at least ``exp`` of the pooled mean NLL (:func:`ppl_entry`).

    Args:
        nll_sums: per-document NLL sums.
        counts: per-document token counts (every entry > 0).
        resamples: bootstrap resamples (documents resampled, as everywhere in this module).
        seed: RNG seed.

    Returns:
        ``ppl, nll, tokens, documents, ci_low, ci_high`` (``nll`` is ``log ppl``, not a mean NLL).
    """
    sums = np.asarray(nll_sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    tokens = int(counts.sum())
    if tokens == 0:
        return {"ppl": None, "nll": None, "tokens": 0, "documents": 0, "ci_low": None, "ci_high": None}
    weighted = counts * np.exp(sums / counts)  # n_d · ppl_d: a token-weighted mean of ppl_d is a ratio of sums
    ppl = float(weighted.sum() / tokens)
    low = high = ppl
    if len(sums) > 1:
        alpha = (1 - CONFIDENCE) / 2 * 100
        low, high = (
            float(v) for v in np.percentile(_bootstrap_means(weighted, counts, resamples, seed), [alpha, 100 - alpha])
        )
    return {
        "ppl": ppl,
        "nll": math.log(ppl),
        "tokens": tokens,
        "documents": int(len(sums)),
        "ci_low": low,
        "ci_high": high,
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


# ---------------------------------------------------------------------------------------------
# Paired comparisons: two models on the same documents / the same trials
# ---------------------------------------------------------------------------------------------


def paired_ppl_ratio(
    a_sums: np.ndarray,
    b_sums: np.ndarray,
    counts: np.ndarray,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired bootstrap of the perplexity ratio ``ppl(a) / ppl(b)`` on the same tokens of the same documents.

    Documents are resampled jointly for both scorings (the same multinomial weights), so the document-to-
    document spread, which dwarfs model differences, cancels. The ratio is ``exp(mean NLL(a) − mean
    NLL(b))`` with token-weighted means, i.e. the ratio of the two perplexities.

    Args:
        a_sums: per-document NLL sums of model ``a``.
        b_sums: per-document NLL sums of model ``b`` over the same tokens.
        counts: per-document token counts.
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        ``ratio``, ``ci_low``, ``ci_high`` (95 %), ``p_value`` (two-sided, of ratio = 1: see :func:`paired_p`),
        ``p_method``, ``p_bootstrap`` and ``documents``.
    """
    a = np.asarray(a_sums, dtype=np.float64)
    b = np.asarray(b_sums, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.float64)
    if len(a) != len(b) or len(a) != len(counts):
        raise ValueError("paired scorings need the same documents in the same order")
    diff = float((a.sum() - b.sum()) / counts.sum())
    out: dict[str, Any] = {"ratio": math.exp(diff), "documents": int(len(a))}
    if len(a) < 2:
        out.update({"ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan})
        return out
    stats = _bootstrap_means(a - b, counts, resamples, seed)
    low, high, p = _interval_and_p(stats, diff)
    out.update({"ci_low": math.exp(low), "ci_high": math.exp(high), **paired_p(a - b, p)})
    return out


def paired_doc_ppl_ratio(
    a_sums: np.ndarray,
    b_sums: np.ndarray,
    counts: np.ndarray,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, Any]:
    """Paired bootstrap of the ratio of two :func:`doc_ppl_entry` aggregates on the same tokens of the same documents.

    ``Σ n_d ppl_d(a) / Σ n_d ppl_d(b)``, documents resampled jointly; the interval and the p-value come from
    the resampled log ratio, so swapping ``a`` and ``b`` inverts the ratio and its interval and keeps the p-value.

    Args:
        a_sums: per-document NLL sums of model ``a``.
        b_sums: per-document NLL sums of model ``b`` over the same tokens.
        counts: per-document token counts (every entry > 0).
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        ``ratio``, ``ci_low``, ``ci_high`` (95 %), ``p_value`` (two-sided, of ratio = 1: see :func:`paired_p`),
        ``p_method``, ``p_bootstrap`` and ``documents``.
    """
    counts = np.asarray(counts, dtype=np.float64)
    a = counts * np.exp(np.asarray(a_sums, dtype=np.float64) / counts)
    b = counts * np.exp(np.asarray(b_sums, dtype=np.float64) / counts)
    if len(a) != len(b) or len(a) != len(counts):
        raise ValueError("paired scorings need the same documents in the same order")
    point = float(math.log(a.sum() / b.sum()))
    out: dict[str, Any] = {"ratio": math.exp(point), "documents": int(len(a))}
    if len(a) < 2:
        out.update({"ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan})
        return out
    w = _weights(len(a), resamples, seed)
    low, high, p = _interval_and_p(np.log(w @ a) - np.log(w @ b), point)
    out.update({"ci_low": math.exp(low), "ci_high": math.exp(high), **paired_p(a - b, p)})
    return out


def paired_p(differences: np.ndarray, bootstrap_p: float) -> dict[str, float | str]:
    """The p-value a paired comparison reports, by how many units (documents) it rests on.

    Up to :data:`EXACT_UNITS` units, the exact sign-flip test over the per-unit differences
    (:func:`sign_flip_test`): it needs no approximation, and it cannot show a p below ``2 / 2^n``, which is all
    that n documents can say. Beyond, the bootstrap's (normal approximation from its standard error), which keeps
    large differences visible after a Holm adjustment over many comparisons.

    Args:
        differences: one paired difference per unit, whose sum is the compared quantity's numerator.
        bootstrap_p: the bootstrap's two-sided p of the same comparison.

    Returns:
        ``p_value``, ``p_method`` (``sign-flip`` or ``bootstrap``) and ``p_bootstrap``.
    """
    if len(differences) <= EXACT_UNITS:
        exact = sign_flip_test(differences)["p_value"]
        return {"p_value": exact, "p_method": "sign-flip", "p_bootstrap": bootstrap_p}
    return {"p_value": bootstrap_p, "p_method": "bootstrap", "p_bootstrap": bootstrap_p}


def _interval_and_p(stats: np.ndarray, point: float) -> tuple[float, float, float]:
    # 95 % percentile interval, and the two-sided p-value of "no difference" from the bootstrap standard
    # error (normal approximation). A count of resamples beyond 0 cannot go below 1 / resamples, which
    # after a Holm adjustment over dozens of comparisons would hide even a large, certain difference.
    alpha = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(stats, [alpha, 100 - alpha])
    se = float(np.std(stats, ddof=1))
    if se == 0.0:
        p = 1.0 if point == 0.0 else 0.0
    else:
        p = math.erfc(abs(point) / se / math.sqrt(2))
    return float(low), float(high), p


def paired_mean_difference(
    a: np.ndarray, b: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict[str, Any]:
    """Paired bootstrap of ``mean(a − b)`` over units (documents) measured for both models.

    Args:
        a: per-document values of model ``a``.
        b: per-document values of model ``b``, document for document.
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        ``difference``, ``ci_low``, ``ci_high`` (95 %), ``p_value`` (see :func:`paired_p`), ``p_method``,
        ``p_bootstrap`` and ``documents``.
    """
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    out: dict[str, Any] = {"difference": float(diff.mean()), "documents": int(len(diff))}
    if len(diff) < 2:
        out.update({"ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan})
        return out
    low, high, p = _interval_and_p(_bootstrap_means(diff, np.ones(len(diff)), resamples, seed), float(diff.mean()))
    out.update({"ci_low": low, "ci_high": high, **paired_p(diff, p)})
    return out


def sign_flip_test(differences: list[float] | np.ndarray, resamples: int = 100_000, seed: int = 0) -> dict[str, Any]:
    """Exact paired permutation (sign-flip) test of ``mean(differences) = 0`` over a few units (documents, inputs).

    Under the null each unit's difference is as likely negative as positive, so every assignment of signs is
    equally likely: the two-sided p is the share of the 2^n assignments whose |mean| reaches the observed one
    (all of them up to 20 units, a seeded sample beyond). It needs no normal approximation, which is what a
    bootstrap's p over five documents leans on: with n units no p below ``2 / 2^n`` can be shown (0.0625 for 5),
    however consistent the units are.

    Args:
        differences: one paired difference per unit (e.g. per-document log perplexity ratio).
        resamples: sign assignments drawn when there are more than 20 units.
        seed: RNG seed of that draw.

    Returns:
        ``p_value``, ``units`` and ``smallest_p`` (the p all units agreeing in sign would give).
    """
    d = np.asarray(differences, dtype=np.float64)
    n = int(len(d))
    if n == 0:
        return {"p_value": math.nan, "units": 0, "smallest_p": math.nan}
    observed = abs(float(d.mean())) - 1e-12 * max(1.0, float(np.abs(d).max()))  # ties count as reaching it
    if n <= 20:
        signs = ((np.arange(2**n)[:, None] >> np.arange(n)) & 1) * 2 - 1
    else:
        signs = np.random.default_rng(seed).choice([-1, 1], size=(resamples, n))
    means = np.abs((signs * d).mean(axis=1))
    return {"p_value": float((means >= observed).mean()), "units": n, "smallest_p": min(1.0, 2.0 / 2**n)}


def mcnemar_exact(a_correct: list[bool], b_correct: list[bool]) -> dict[str, float | int]:
    """Exact McNemar test of two models on the same trials (two-sided binomial test on discordant pairs).

    Args:
        a_correct: per-trial correctness of model ``a``.
        b_correct: per-trial correctness of model ``b``, trial for trial.

    Returns:
        ``trials``, ``a_correct``, ``b_correct``, ``only_a`` (a right, b wrong), ``only_b``, ``difference``
        (accuracy a − b) and ``p_value`` (1.0 without discordant pairs).
    """
    if len(a_correct) != len(b_correct):
        raise ValueError(f"paired trials differ in number: {len(a_correct)} vs {len(b_correct)}")
    n = len(a_correct)
    only_a = sum(1 for x, y in zip(a_correct, b_correct, strict=True) if x and not y)
    only_b = sum(1 for x, y in zip(a_correct, b_correct, strict=True) if y and not x)
    discordant = only_a + only_b
    k = min(only_a, only_b)
    # P(X ≤ k) for X ~ Binomial(discordant, 1/2), doubled for a two-sided test.
    tail = sum(math.comb(discordant, i) for i in range(k + 1)) / 2.0**discordant if discordant else 1.0
    return {
        "trials": n,
        "a_correct": int(sum(map(bool, a_correct))),
        "b_correct": int(sum(map(bool, b_correct))),
        "only_a": only_a,
        "only_b": only_b,
        "difference": (only_a - only_b) / n if n else math.nan,
        "p_value": min(1.0, 2 * tail),
    }


def holm(p_values: list[float]) -> list[float]:
    """Holm–Bonferroni adjusted p-values (family-wise error control over all the comparisons made).

    Args:
        p_values: raw p-values (NaN entries are passed through and not counted).

    Returns:
        Adjusted p-values in the input order.
    """
    idx = [i for i, p in enumerate(p_values) if p is not None and math.isfinite(p)]
    order = sorted(idx, key=lambda i: p_values[i])
    m = len(order)
    adjusted = [math.nan] * len(p_values)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def cluster_rate(
    correct: list[bool], clusters: list[Any], resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict[str, float | int]:
    """A success rate with a 95 % cluster-bootstrap interval: trials that share a context resample together.

    Trials of one input (a key set's answers, one prompt re-scored over training seeds) are not independent;
    resampling whole clusters keeps their correlation in the interval, where a Wilson interval over all trials
    would be too narrow. With one trial per cluster it is an ordinary bootstrap of the rate.

    Args:
        correct: per-trial outcomes.
        clusters: per-trial cluster labels (an input's index, a prompt's seed …), any hashable.
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        ``rate``, ``ci_low``, ``ci_high``, ``correct``, ``trials`` and ``clusters``.
    """
    if len(correct) != len(clusters):
        raise ValueError(f"{len(correct)} outcomes but {len(clusters)} cluster labels")
    labels = sorted(set(clusters), key=str)
    index = {c: i for i, c in enumerate(labels)}
    hits, counts = np.zeros(len(labels)), np.zeros(len(labels))
    for ok, c in zip(correct, clusters, strict=True):
        hits[index[c]] += float(bool(ok))
        counts[index[c]] += 1
    n = int(counts.sum())
    out: dict[str, float | int] = {"correct": int(hits.sum()), "trials": n, "clusters": len(labels)}
    out["rate"] = float(hits.sum() / n) if n else math.nan
    if len(labels) < 2:
        out.update({"ci_low": math.nan, "ci_high": math.nan})
        return out
    stats = _bootstrap_means(hits, counts, resamples, seed)
    alpha = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(stats, [alpha, 100 - alpha])
    out.update({"ci_low": float(low), "ci_high": float(high)})
    return out


def paired_cluster_difference(
    a_correct: list[bool],
    b_correct: list[bool],
    clusters: list[Any],
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> dict[str, float | int]:
    """Paired difference of two models' rates on the same clustered trials, clusters resampled together.

    Args:
        a_correct: per-trial outcomes of model ``a``.
        b_correct: model ``b``'s on the same trials.
        clusters: per-trial cluster labels.
        resamples: bootstrap resamples.
        seed: RNG seed.

    Returns:
        ``difference`` (rate a − rate b), ``ci_low``, ``ci_high``, ``p_value``, ``trials`` and ``clusters``.
    """
    if not len(a_correct) == len(b_correct) == len(clusters):
        raise ValueError("paired outcomes and cluster labels differ in number")
    labels = sorted(set(clusters), key=str)
    index = {c: i for i, c in enumerate(labels)}
    diff, counts = np.zeros(len(labels)), np.zeros(len(labels))
    for a, b, c in zip(a_correct, b_correct, clusters, strict=True):
        diff[index[c]] += float(bool(a)) - float(bool(b))
        counts[index[c]] += 1
    n = int(counts.sum())
    point = float(diff.sum() / n) if n else math.nan
    out: dict[str, float | int] = {"difference": point, "trials": n, "clusters": len(labels)}
    if len(labels) < 2:
        out.update({"ci_low": math.nan, "ci_high": math.nan, "p_value": math.nan})
        return out
    low, high, p = _interval_and_p(_bootstrap_means(diff, counts, resamples, seed), point)
    out.update({"ci_low": low, "ci_high": high, "p_value": p})
    return out
