"""Paired comparisons: bootstrap ratio on the same documents, exact McNemar, Holm, and the report section."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ctxext.errors import InputError
from ctxext.evaluation.paired import compare_models
from ctxext.evaluation.report import comparisons_markdown
from ctxext.scoring.stats import holm, mcnemar_exact, paired_ppl_ratio, ppl_entry


def _binom_two_sided(k: int, n: int) -> float:
    # Independent reference: the exact two-sided sign test, P(X <= k) + P(X >= n - k) for X ~ Bin(n, 1/2).
    pmf = [math.comb(n, i) * 0.5**n for i in range(n + 1)]
    low = sum(pmf[: k + 1])
    high = sum(pmf[n - k :])
    return min(1.0, low + high) if 2 * k != n else 1.0


def test_mcnemar_exact_counts_discordant_pairs():
    a = [True] * 6 + [False] * 4 + [True] * 2
    b = [False] * 6 + [False] * 4 + [True] * 2
    r = mcnemar_exact(a, b)
    assert (r["only_a"], r["only_b"], r["a_correct"], r["b_correct"], r["trials"]) == (6, 0, 8, 2, 12)
    assert r["p_value"] == pytest.approx(2 / 2**6)
    assert r["difference"] == pytest.approx(6 / 12)
    # 12/30 vs 6/30 with 9 vs 3 discordant trials: not significant.
    a = [True] * 9 + [False] * 3 + [True] * 3 + [False] * 15
    b = [False] * 9 + [True] * 3 + [True] * 3 + [False] * 15
    r = mcnemar_exact(a, b)
    assert (r["a_correct"], r["b_correct"]) == (12, 6)
    assert r["p_value"] == pytest.approx(_binom_two_sided(3, 12)) and r["p_value"] > 0.05
    assert mcnemar_exact([True, False], [True, False])["p_value"] == 1.0
    with pytest.raises(ValueError):
        mcnemar_exact([True], [True, False])


def test_holm_adjustment():
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    adjusted = holm([0.5, float("nan"), 0.001])
    assert adjusted[0] == pytest.approx(0.5) and math.isnan(adjusted[1]) and adjusted[2] == pytest.approx(0.002)


def test_paired_ci_excludes_one_where_unpaired_intervals_overlap():
    # Documents differ a lot (mean NLL 2.0 … 4.0 nats); model b is 0.03 nats/token worse on every document.
    rng = np.random.default_rng(0)
    counts = np.full(20, 255.0)
    doc_nll = np.linspace(2.0, 4.0, 20)
    a = doc_nll * counts
    b = (doc_nll + 0.03 + rng.normal(0, 0.005, 20)) * counts
    ea, eb = ppl_entry(a, counts), ppl_entry(b, counts)
    assert ea["ci_high"] > eb["ci_low"]  # unpaired intervals overlap
    r = paired_ppl_ratio(b, a, counts)
    assert r["ratio"] == pytest.approx(eb["ppl"] / ea["ppl"])
    assert 1 < r["ci_low"] <= r["ratio"] <= r["ci_high"]
    assert r["p_value"] < 0.01 and r["documents"] == 20
    same = paired_ppl_ratio(a, a, counts)
    assert same["ratio"] == 1.0 and same["ci_low"] == same["ci_high"] == 1.0
    assert math.isnan(paired_ppl_ratio(a[:1], b[:1], counts[:1])["ci_low"])  # one document: no interval


def _ppl_section(keys, sums_by_len, mode="one-pass"):
    return {
        "mode": mode,
        "per_document": {
            "keys": keys,
            "by_length": {
                L: {"docs": list(range(len(s))), "nll_sums": list(s), "tokens": [int(L) - 1] * len(s)}
                for L, s in sums_by_len.items()
            },
        },
    }


def test_compare_models_pairs_documents_by_content_and_grid_trials():
    base = {
        "name": "base",
        "perplexity": _ppl_section(["d1", "d2", "d3"], {"64": [100.0, 150.0, 200.0]}),
        "needle": {"cells": [{"length": 64, "depth": 0.0, "outcomes": [True, True, False]}]},
    }
    # The other model saw the same documents in another order plus one the base did not see.
    other = {
        "name": "yarn",
        "perplexity": _ppl_section(["d3", "dX", "d1", "d2"], {"64": [210.0, 1.0, 110.0, 160.0]}),
        "needle": {"cells": [{"length": 64, "depth": 0.0, "outcomes": [False, True, False]}]},
    }
    comp = compare_models([base, other], resamples=200)
    assert comp["reference"] == "base"
    (row,) = comp["perplexity"]
    assert row["documents"] == 3
    assert row["ratio"] == pytest.approx(math.exp((480.0 - 450.0) / (3 * 63)))
    (grid,) = comp["grids"]
    assert (grid["only_a"], grid["only_b"], grid["a_correct"], grid["b_correct"]) == (0, 1, 1, 2)
    assert comp["comparisons"] == 2 and all("p_holm" in r for r in comp["perplexity"] + comp["grids"])
    flipped = compare_models([base, other], reference="yarn", resamples=200)
    assert flipped["reference"] == "yarn" and flipped["perplexity"][0]["ratio"] == pytest.approx(1 / row["ratio"])
    with pytest.raises(InputError, match="not a model of this report"):
        compare_models([base, other], reference="nope")
    assert compare_models([base]) is None
    md = "\n".join(comparisons_markdown(comp))
    assert "Paired comparisons against `base`" in md and "McNemar" in md and "2 comparisons" in md


def test_compare_models_pairs_ruler_task_trials():
    # RULER-style tasks sit under ruler.tasks; each is paired trial by trial like a top-level grid.
    def entry(name, outcomes):
        cells = [
            {"length": 64, "depth": 10.0, "outcomes": outcomes},
            {"length": 128, "depth": 10.0, "outcomes": [0, 0]},
        ]
        return {"name": name, "ruler": {"tasks": {"multikey-1": {"cells": cells}}}}

    comp = compare_models([entry("base", [1, 1, 0, 0]), entry("ft", [1, 0, 1, 1])])
    rows = {r["length"]: r for r in comp["grids"]}
    assert set(rows) == {64, 128, "all"} and rows[64]["task"] == "ruler/multikey-1"
    assert (rows[64]["only_a"], rows[64]["only_b"]) == (2, 1)
    assert "ruler/multikey-1" in "\n".join(comparisons_markdown(comp))
    # 128 tokens: both fail every trial — no discordant trial, so it cannot reject and is not in the family.
    assert rows[128]["p_value"] == 1.0 and rows[128]["p_holm"] == 1.0
    assert comp["comparisons"] == 2 and any("left out of the Holm family" in n for n in comp["notes"])


def test_one_pass_and_per_length_perplexity_are_paired_sliding_is_not():
    # Static RoPE scores every length in one pass, dynamic RoPE one pass per length: the same truncated-document
    # NLLs, so they pair; sliding-window NLLs are another quantity.
    keys, lower = ["d1", "d2", "d3"], {"64": [90.0, 140.0, 190.0]}
    ref = {"name": "yarn", "perplexity": _ppl_section(keys, {"64": [100.0, 150.0, 200.0]})}
    dyn = {"name": "dynamic", "perplexity": _ppl_section(keys, lower, "per-length")}
    slid = {"name": "sliding", "perplexity": _ppl_section(keys, lower, "sliding")}
    comp = compare_models([ref, dyn, slid], resamples=200)
    assert [r["model"] for r in comp["perplexity"]] == ["dynamic"]
    assert comp["perplexity"][0]["ratio"] < 1
    assert any("sliding: perplexity not paired" in n for n in comp["notes"])


def test_the_sign_flip_test_is_exact_over_few_units():
    from ctxext.scoring.stats import sign_flip_test

    # Five units all in one direction: of the 32 sign assignments, 2 reach the mean (all + and all −).
    agree = sign_flip_test([0.11, 0.10, 0.12, 0.11, 0.10])
    assert agree["p_value"] == pytest.approx(2 / 32) and agree["smallest_p"] == pytest.approx(2 / 32)
    # A bootstrap's normal approximation would call these five "p ≈ 0"; the exact test cannot go below 1/16.
    assert sign_flip_test([0.1, -0.1])["p_value"] == 1.0
    mixed = sign_flip_test([3.0, 1.0, -1.0, 2.0])  # |sum| 5 is reached by ±(3+1+1+2), ±(3+1−1+2), ±(3−1+1+2)
    assert mixed["p_value"] == pytest.approx(6 / 16)
    # Many units: a seeded sample of assignments. Mean 0.125 against a null spread of sd ≈ 0.14: p ≈ 0.37.
    many = sign_flip_test([1.0] * 15 + [-1.0] * 15 + [0.5] * 10, resamples=20_000)
    assert many["units"] == 40 and 0.3 < many["p_value"] < 0.45
    assert sign_flip_test([1.0] * 30 + [-1.0] * 5, resamples=20_000)["p_value"] < 0.001


def test_a_paired_ratio_over_few_documents_reports_the_exact_sign_flip_p():
    # Five documents, model b worse on every one by a consistent 0.1 nats/token: the bootstrap's normal
    # approximation calls that certain; five documents cannot show p below 2 / 2^5.
    counts = np.full(5, 1000.0)
    a = np.linspace(2.0, 3.0, 5) * counts
    b = a + 0.1 * counts + np.arange(5.0)
    few = paired_ppl_ratio(b, a, counts)
    assert few["p_method"] == "sign-flip" and few["p_value"] == pytest.approx(2 / 2**5)
    assert few["p_bootstrap"] < 1e-10  # what was reported before, and is still kept
    # Beyond EXACT_UNITS documents the bootstrap's p is the one reported.
    from ctxext.scoring.stats import EXACT_UNITS

    n = EXACT_UNITS + 4
    counts = np.full(n, 1000.0)
    a = np.linspace(2.0, 3.0, n) * counts
    many = paired_ppl_ratio(a + 0.1 * counts + np.arange(float(n)), a, counts)
    assert many["p_method"] == "bootstrap" and many["p_value"] == many["p_bootstrap"] < 1e-10
