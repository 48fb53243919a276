"""The relative target (``ctxext.evaluation.target``): per-depth targets from the base, the three states, a report."""

from __future__ import annotations

import pytest

from ctxext.evaluation.target import (
    FEW,
    MEETS,
    MISSES,
    depth_target,
    read_depth,
    read_report,
    reading_lines,
    report_readings,
    target_markdown,
)


def _outcomes(correct: int, trials: int) -> list[int]:
    return [1] * correct + [0] * (trials - correct)


def test_a_depths_target_is_the_base_minus_3_points_capped_at_90():
    assert depth_target(1.0) == pytest.approx(0.90)
    assert depth_target(0.92) == pytest.approx(0.89)
    assert depth_target(0.41) == pytest.approx(0.38)


@pytest.mark.parametrize(
    ("correct", "trials", "state"),
    [
        (285, 300, MEETS),  # 95 % [92, 97]: reaches 90 and the bound is well within 5 points
        (275, 300, MEETS),  # 91.7 % [88.0, 94.3]: the bound 2 points below the target
        (46, 50, FEW),  # 92 % [81, 97]: reaches 90, but the bound is 9 points below
        (269, 300, MISSES),  # 89.7 %: under the target, whatever its bound
    ],
)
def test_a_depth_meets_falls_short_of_trials_or_misses(correct, trials, state):
    reading = read_depth(50, _outcomes(100, 100), _outcomes(correct, trials))
    assert reading.target == pytest.approx(0.90)
    assert reading.state == state


def test_a_weak_base_sets_a_low_bar():
    # The base retrieves 40 % in its window: 38 % at 4× meets its target (37), 30 % does not.
    assert read_depth(0, _outcomes(120, 300), _outcomes(114, 300)).state == MEETS
    assert read_depth(0, _outcomes(120, 300), _outcomes(90, 300)).state == MISSES


def _model(name: str, cells: dict[tuple[int, int], tuple[int, int]]) -> dict:
    return {
        "name": name,
        "needle": {
            "cells": [
                {"length": length, "depth": float(depth), "outcomes": _outcomes(c, n)}
                for (length, depth), (c, n) in cells.items()
            ]
        },
    }


def _report(tuned_far: int, tuned_in: int, ratio: float) -> dict:
    depths = (10, 50, 90)
    base = _model("base", {(64, d): (100, 100) for d in depths} | {(256, d): (20, 100) for d in depths})
    tuned = _model("tuned", {(64, d): (tuned_in, 100) for d in depths} | {(256, d): (tuned_far, 100) for d in depths})
    row = {"model": "tuned", "view": "length", "length": 64, "ratio": ratio, "ci_low": ratio - 0.02}
    return {
        "models": [base, tuned],
        "comparisons": {"reference": "base", "perplexity": [row | {"ci_high": ratio + 0.02}]},
    }


def test_a_report_reads_per_depth_in_window_and_perplexity():
    reading = read_report(_report(97, 99, 0.95), "tuned", "base", 64, 256)
    assert reading is not None and reading.state == MEETS
    assert [d.depth for d in reading.depths] == [10, 50, 90]
    lines = reading_lines(reading)
    assert lines[0].startswith("relative target") and "tuned at 256 tokens against the base at 64" in lines[0]
    assert lines[-1].lstrip().startswith("→ meets it") and "100 prompts per depth" in lines[-1]


@pytest.mark.parametrize(
    ("far", "inside", "ratio", "named"),
    [
        (85, 99, 0.95, "depth 10 %: 85 %"),  # short at 4×
        (97, 95, 0.95, "in its window: 95 % vs the base's 100 %"),  # lost 5 points inside the window
        (97, 99, 1.05, "perplexity at 64: ×1.050"),  # in-window perplexity up 5 %
    ],
)
def test_any_part_that_misses_fails_the_reading_and_its_line_says_which(far, inside, ratio, named):
    reading = read_report(_report(far, inside, ratio), "tuned", "base", 64, 256)
    assert reading is not None and reading.state == MISSES
    lines = reading_lines(reading)
    assert any(named in line and line.endswith("✗") for line in lines), lines
    assert lines[-1].lstrip().startswith("→ does not meet it")


def test_a_report_without_the_cells_it_needs_reads_as_none():
    report = _report(97, 99, 0.95)
    assert read_report(report, "missing", "base", 64, 256) is None
    assert read_report(report, "tuned", "base", 64, 512) is None  # no cells at that length


def _rope(original: int, current: int) -> dict:
    return {"original_length": original, "current_length": current}


def test_a_report_reads_every_model_extended_from_its_unextended_reference():
    report = _report(97, 99, 0.95)
    base, tuned = report["models"]
    base["rope"], tuned["rope"] = _rope(64, 64), _rope(64, 256)
    # A model of another window, and one not extended, are not readings of this base.
    other = _model("other", {(64, 10): (1, 1)}) | {"rope": _rope(128, 512)}
    plain = _model("plain", {(64, 10): (1, 1)}) | {"rope": _rope(64, 64)}
    report["models"] += [other, plain]
    assert [r.model for r in report_readings(report)] == ["tuned"]
    lines = target_markdown(report)
    assert lines[0] == "## Relative target: each extension against `base` in its own window"
    row = next(line for line in lines if line.startswith("| tuned |"))
    assert row.startswith("| tuned | 256 | 97 [92, 99] vs 90 ✓") and row.endswith("| ×0.950 ✓ | meets it |")
    # A reference that is itself extended is no base to read against: no section.
    base["rope"] = _rope(64, 256)
    assert report_readings(report) == [] and target_markdown(report) == []
