"""``ctxext search``: the worst-depth objective, the attention-factor gene and the in-window paired cost."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ctxext.errors import CtxextError, InputError
from ctxext.recipe.flags import build_settings
from ctxext.scoring.windows import admissible, paired_window_ratio
from ctxext.search.evolution import Evolution, EvolutionSettings
from ctxext.search.factors import is_monotone
from ctxext.search.objective import ItemScores, ObjectiveSet
from ctxext.search.report import window_verdict
from ctxext.search.run import SearchSettings, run_search
from tests.unit.search.test_search import _settings


def test_worst_depth_fitness_is_the_worst_depths_mean_nll():
    depths: list[float | None] = [0.0, 0.0, 0.5, 0.5]
    scores = ItemScores(nll_sums=np.array([1.0, 3.0, 8.0, 2.0]), counts=np.array([1.0, 1.0, 2.0, 2.0]))
    worst = ObjectiveSet("needle", 8, [[0]] * 4, [(7, 8)] * 4, depths, aggregate="worst-depth")
    mean = ObjectiveSet("needle", 8, [[0]] * 4, [(7, 8)] * 4, depths)
    assert scores.depth_nll(depths) == {0.0: 2.0, 0.5: 2.5}
    assert worst.fitness(scores) == 2.5
    assert mean.fitness(scores) == pytest.approx(14.0 / 6.0)


def test_attention_gene_stays_in_its_range_and_factors_stay_monotone():
    evo = Evolution(EvolutionSettings(seed=3, mutation_rate=0.5), lower=1.0, upper=5.0, attention=(1.0, 1.2))
    parent = np.array([1.0, 1.5, 2.0, 4.0, 1.1])
    other = np.array([1.0, 1.0, 3.0, 5.0, 1.2])
    seen_attention = set()
    for _ in range(200):
        for child in (evo.mutate(parent), evo.crossover(parent, other)):
            if child is None:
                continue
            assert is_monotone(child[:4]) and 1.0 <= child[:4].min() and child[:4].max() <= 5.0
            assert 1.0 <= child[4] <= 1.2
            seen_attention.add(round(float(child[4]), 6))
    assert len(seen_attention) > 5  # the gene is searched, not fixed
    # The trailing gene is outside the monotonicity constraint: 1.1 after 4.0 is valid.
    assert evo.clip(np.array([0.5, 2.0, 9.0, 9.0, 1.5])).tolist() == [1.0, 2.0, 5.0, 5.0, 1.2]


def test_paired_window_ratio_identical_and_changed():
    rng = np.random.default_rng(0)
    base = rng.uniform(1, 5, size=(40, 15))
    same = paired_window_ratio(base.copy(), base)
    assert same["ratio"] == 1.0 and same["includes_one"] and window_verdict(same) == "identical"
    worse = paired_window_ratio(base + 0.01, base)
    assert worse["ratio"] == pytest.approx(math.exp(0.01)) and not worse["includes_one"]
    assert worse["ci_low"] > 1.0 and window_verdict(worse) == "changed"
    noisy = paired_window_ratio(base + rng.normal(0, 0.05, size=base.shape), base)
    assert window_verdict(noisy) in ("not detectably changed", "changed")


# One generation and 12 in-window documents: enough to exercise the attention gene, quick on 2 cores.
ATT = dict(attention_factor="search", window_tolerance=50.0, objective="needle-worst", generations=1, window_docs=12)


@pytest.fixture(scope="module")
def att_search(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("att") / "a"
    return run_search(_settings(tiny_model_dir, out, **ATT), log=lambda _: None)


def test_searched_attention_factor_respects_the_window_tolerance(att_search):
    result, out = att_search, att_search.out
    header = json.loads((out / "search.jsonl").read_text().splitlines()[0])
    limit = header["attention_limit"]
    ceiling = math.sqrt(1 + math.log(2) / math.log(256))
    # A tolerance of +50 % admits every factor on the grid up to LongRoPE's value.
    assert limit["high"] == pytest.approx(math.floor(ceiling * 100 + 1e-9) / 100)
    assert all(s["ci_high"] <= 1.5 for s in limit["scan"])
    assert 1.0 <= result.attention_factor <= limit["high"]
    candidates = [json.loads(x) for x in (out / "search.jsonl").read_text().splitlines() if '"candidate"' in x]
    assert all(1.0 <= c["attention_factor"] <= limit["high"] for c in candidates)
    written = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert written["attention_factor"] == result.attention_factor
    assert header["settings"]["attention_factor"] == "search" and header["objective_set"]["aggregate"] == "worst-depth"


def test_attention_search_resumes_to_the_uninterrupted_result(att_search, tiny_model_dir, tmp_path):
    out = tmp_path / "r"
    seen = []

    def interrupt(cand):
        seen.append(cand.index)
        if len(seen) == 5:
            raise KeyboardInterrupt

    with pytest.raises(CtxextError, match="search interrupted"):  # Ctrl-C names the log to resume from
        run_search(_settings(tiny_model_dir, out, **ATT), log=lambda _: None, on_candidate=interrupt)
    resumed = run_search(_settings(tiny_model_dir, out, resume=True, **ATT), log=lambda _: None)
    assert resumed.long_factor == att_search.long_factor
    assert resumed.attention_factor == att_search.attention_factor
    assert resumed.evaluations == att_search.evaluations

    def scores(path):
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        return [(r["factors"], r["attention_factor"], r["score"]) for r in lines if r["type"] == "candidate"]

    assert scores(out / "search.jsonl") == scores(att_search.out / "search.jsonl")


def test_zero_tolerance_admits_only_undetectable_in_window_changes(tiny_model_dir, tmp_path):
    out = tmp_path / "att0"
    result = run_search(
        _settings(tiny_model_dir, out, attention_factor="search", generations=1, window_docs=12), log=lambda _: None
    )
    limit = json.loads((out / "search.jsonl").read_text().splitlines()[0])["attention_limit"]
    assert limit["tolerance"] == 0.0
    # Every factor admitted has a paired in-window interval that reaches down to 1; the next one does not.
    admitted = [s for s in limit["scan"] if s["attention_factor"] <= limit["high"]]
    assert all(s["ci_low"] <= 1.0 for s in admitted)
    rejected = [s for s in limit["scan"] if s["attention_factor"] > limit["high"]]
    assert all(s["ci_low"] > 1.0 for s in rejected) and len(rejected) <= 1
    assert 1.0 <= result.attention_factor <= limit["high"]


def test_admissible_in_window_cost():
    assert admissible({"ci_low": 0.999, "ci_high": 1.01}, 0.0)  # not detectable
    assert not admissible({"ci_low": 1.001, "ci_high": 1.004}, 0.0)  # detectable, no tolerance
    assert admissible({"ci_low": 1.001, "ci_high": 1.004}, 0.005)  # detectable, within +0.5 %
    assert not admissible({"ci_low": 1.004, "ci_high": 1.006}, 0.005)


def test_window_tolerance_is_checked():
    # Percent, as on the command line and in a recipe: 150 % is refused, naming the flag.
    with pytest.raises(InputError, match="--window-tolerance"):
        build_settings(SearchSettings, {"window_tolerance": 150}, {"model": "m", "target_length": 10, "out": "o"})
    assert build_settings(SearchSettings, {"window_tolerance": 1.5}, {"model": "m", "target_length": 10, "out": "o"})
