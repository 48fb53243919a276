"""RULER's string-match metrics on hand-made cases (definitions of NVIDIA/RULER scripts/eval/synthetic/constants.py)."""

from __future__ import annotations

import pytest

from ctxext.errors import InputError
from ctxext.scoring.string_match import (
    postprocess_prediction,
    sample_match_all,
    sample_match_part,
    sample_metric,
    score_predictions,
    string_match_all,
    string_match_part,
)


def _ruler_all(preds, refs):
    # RULER's formula, written out independently: mean over samples of the fraction found, × 100, 2 decimals.
    per = [sum(r.lower() in p.lower() for r in ref) / len(ref) for p, ref in zip(preds, refs, strict=True)]
    return round(sum(per) / len(preds) * 100, 2)


def _ruler_part(preds, refs):
    per = [max(r.lower() in p.lower() for r in ref) for p, ref in zip(preds, refs, strict=True)]
    return round(sum(per) / len(preds) * 100, 2)


def test_single_reference_found_missed_and_case():
    assert sample_match_all("The special magic number is 48213.", ["48213"]) == 1.0
    assert sample_match_all("The special magic number is 4821.", ["48213"]) == 0.0  # a partial answer is a miss
    assert sample_match_all("the WORD is Apple", ["apple"]) == 1.0  # case-insensitive
    assert sample_match_part("APPLE pie", ["Apple"]) == 1.0


def test_multiple_references_all_versus_part():
    refs = ["123", "456", "789"]
    assert sample_match_all("123 and 456", refs) == pytest.approx(2 / 3)
    assert sample_match_part("123 and 456", refs) == 1.0
    assert sample_match_all("nothing here", refs) == 0.0 and sample_match_part("nothing here", refs) == 0.0
    assert sample_match_all("789, 456, 123", refs) == 1.0  # any order, any format
    # Over samples: the mean of the per-sample scores, in percent, rounded to 2 decimals (RULER).
    preds = ["123 and 456", "789", "none", "123 456 789"]
    many = [refs, refs, ["x"], refs]
    assert string_match_all(preds, many) == pytest.approx(_ruler_all(preds, many)) == 50.0  # (2/3 + 1/3 + 0 + 1) / 4
    assert string_match_part(preds, many) == pytest.approx(_ruler_part(preds, many)) == 75.0


def test_postprocessing_is_rulers():
    assert postprocess_prediction("  12\x0034\tfoo\n ") == "12\n34\nfoo"
    # A reference split by a control character in the output is not found (RULER cleans, then matches).
    assert score_predictions(["12\x0034"], [["1234"]]) == 0.0
    assert score_predictions(["  1234\n"], [["1234"]]) == 100.0


def test_metric_names_and_bad_input():
    assert sample_metric("all") is sample_match_all and sample_metric("string_match_part") is sample_match_part
    with pytest.raises(InputError, match="use all or part"):
        sample_metric("exact")
    with pytest.raises(InputError, match="at least one reference"):
        sample_match_all("x", [])
    with pytest.raises(InputError, match="2 predictions but 1"):
        score_predictions(["a", "b"], [["a"]])
    with pytest.raises(InputError, match="no predictions"):
        score_predictions([], [])
