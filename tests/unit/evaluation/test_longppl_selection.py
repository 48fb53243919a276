"""LongPPL without a self-favouring evaluator: symmetric key tokens, the reference code's aggregation.

The key tokens of a comparison are the union of every compared model's own (or one named evaluator's, which is
then not compared), so swapping the models' order changes no ratio's direction or significance; LongPPL and
perplexity aggregate over documents as the reference code does (per-document values, key-token / token
weights). Each is checked on numbers small enough to compute by hand, and the order on two differently
extended copies of one tiny model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch


def test_official_aggregation_by_hand():
    from ctxext.scoring.stats import doc_ppl_entry, paired_doc_ppl_ratio, ppl_entry

    # Two documents: 1 key token with NLL 2, then 2 key tokens with NLLs summing to 3.
    got = doc_ppl_entry(np.array([2.0, 3.0]), np.array([1, 2]), resamples=200)
    official = (1 * math.exp(2.0) + 2 * math.exp(1.5)) / 3  # (7.3891 + 8.9634) / 3 = 5.4508
    assert got["ppl"] == pytest.approx(official) and got["ppl"] == pytest.approx(5.450811, rel=1e-6)
    assert got["tokens"] == 3 and got["documents"] == 2 and got["ci_low"] <= got["ppl"] <= got["ci_high"]
    pooled = ppl_entry(np.array([2.0, 3.0]), np.array([1, 2]))["ppl"]
    assert pooled == pytest.approx(math.exp(5 / 3)) and pooled < got["ppl"]  # Jensen: pooled is lower
    # One document: both aggregations agree, and the interval is the point.
    one = doc_ppl_entry(np.array([3.0]), np.array([2]))
    assert one["ppl"] == pytest.approx(math.exp(1.5)) == pytest.approx(one["ci_low"]) == pytest.approx(one["ci_high"])
    # The paired ratio of two such aggregates, and its mirror image when the models swap.
    a, b, n = np.array([2.0, 3.0, 1.0]), np.array([1.0, 3.5, 2.0]), np.array([1, 2, 2])
    ab, ba = paired_doc_ppl_ratio(a, b, n, 300), paired_doc_ppl_ratio(b, a, n, 300)
    by_hand = (math.exp(2) + 2 * math.exp(1.5) + 2 * math.exp(0.5)) / (
        math.exp(1) + 2 * math.exp(1.75) + 2 * math.exp(1)
    )
    assert ab["ratio"] == pytest.approx(by_hand) and ab["ratio"] * ba["ratio"] == pytest.approx(1)
    assert ab["p_value"] == pytest.approx(ba["p_value"])
    assert ab["ci_low"] * ba["ci_high"] == pytest.approx(1) and ab["ci_high"] * ba["ci_low"] == pytest.approx(1)


def _settings(**extra):
    from ctxext.evaluation.sections.longppl.settings import LongPPLSettings

    return LongPPLSettings(lengths=[6], short_context=2, stride=1, resamples=50, **extra)


def _run(order: list[str], evaluator: str | None = None):
    """Two models' scores on two 6-token documents (K + S = 3: tokens 4 and 5 are candidates), by hand.

    Model a alone finds token 4 of document 0 key; model b finds token 5 of document 0 and token 4 of
    document 1 (LSD > 2 nats and long NLL < 2).
    """
    from ctxext.evaluation.sections.longppl.engine import LongPPLRun, ModelScores

    long = {
        "a": [[3.0, 3.0, 3.0, 0.5, 3.0], [3.0, 3.0, 3.0, 2.5, 1.0]],
        "b": [[3.0, 3.0, 3.0, 1.0, 0.2], [3.0, 3.0, 3.0, 0.4, 3.0]],
    }
    short = {
        "a": [[3.0, 3.0, 3.0, 4.0, 3.0], [3.0, 3.0, 3.0, 3.0, 2.0]],
        "b": [[3.0, 3.0, 3.0, 2.0, 4.0], [3.0, 3.0, 3.0, 3.0, 3.0]],
    }
    run = LongPPLRun(short_context=2, stride=1, evaluator=evaluator, context=6, lengths=[6])
    for name in order:
        picks = evaluator is None or evaluator == name
        run.models[name] = ModelScores(
            ["d0", "d1"],
            {6: [torch.tensor(v) for v in long[name]]},
            6,
            {6: [torch.tensor(v) for v in short[name]]} if picks else None,
        )
    return run, long


def test_union_of_key_tokens_and_aggregation_by_hand():
    from ctxext.evaluation.sections.longppl.engine import model_result, select_keys

    settings = _settings()
    results = {}
    for order in (["a", "b"], ["b", "a"]):
        run, long = _run(order)
        select_keys(run, settings)
        assert [k.tolist() for k in run.keys[6]] == [[4, 5], [4]]  # a's (0, 4) ∪ b's (0, 5), (1, 4)
        results[tuple(order)] = {n: model_result(n, settings, run) for n in order}
    first, second = results[("a", "b")], results[("b", "a")]
    for name in ("a", "b"):
        e = first[name]["by_length"]["6"]
        d0, d1 = long[name][0][3] + long[name][0][4], long[name][1][3]  # key NLL sums: token t is entry t − 1
        assert e["longppl"]["ppl"] == pytest.approx((2 * math.exp(d0 / 2) + math.exp(d1)) / 3)
        assert e["longppl_pooled"]["ppl"] == pytest.approx(math.exp((d0 + d1) / 3))
        sums = [sum(doc) for doc in long[name]]
        assert e["ppl"]["ppl"] == pytest.approx(sum(5 * math.exp(s / 5) for s in sums) / 10)
        assert e["key_tokens"] == 3 and e["own_key_tokens"] == {"a": 1, "b": 2}[name]
        assert first[name]["by_length"] == second[name]["by_length"]  # the order changes nothing
        assert first[name]["selectors"] == ["a", "b"] and not first[name].get("selection_biased")


def test_a_named_evaluator_picks_alone_and_is_marked():
    from ctxext.evaluation.sections.longppl.engine import model_result, select_keys
    from ctxext.evaluation.sections.longppl.report import longppl_markdown

    settings = _settings(evaluator="a")
    run, _ = _run(["b", "a"], evaluator="a")
    select_keys(run, settings)
    assert [k.tolist() for k in run.keys[6]] == [[4], []] and run.selectors == ["a"]
    a, b = model_result("a", settings, run), model_result("b", settings, run)
    assert a["selection_biased"] and not b.get("selection_biased") and b["by_length"]["6"]["key_tokens"] == 1
    # The evaluator is the report's reference here, yet the ratios are not taken against it.
    models = [{"name": "a", "longppl": a}, {"name": "b", "longppl": b}]
    md = "\n".join(longppl_markdown(models, {"comparisons": {"reference": "a"}}, "LongPPL"))
    assert "(evaluator: not compared)" in md and "chosen by the evaluator **a** alone" in md


SUITE = """
name: longppl-order
longppl:
  data: builtin:stdlib
  lengths: [512]
  short_context: 64
  stride: 32
  lsd_threshold: 0.0
  lcl_threshold: -30.0
  max_docs: 4
  resamples: 300
"""


@pytest.fixture(scope="module")
def two_extensions(tiny_tokenizer, tmp_path_factory):
    """Two differently extended copies of one tiny model (context 256 → 1024): NTK and YaRN.

    Its weights are drawn wide (initializer range 0.5): with the default 0.02 attention is nearly uniform, the
    far context changes no prediction, and both copies would pick the same tokens.
    """
    from ctxext.models.folder import extend_folder
    from tests.helpers.tiny import tiny_model

    root = tmp_path_factory.mktemp("longppl-order")
    ids = {k: getattr(tiny_tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    tiny_model("llama", initializer_range=0.5, **ids).save_pretrained(root / "base")
    tiny_tokenizer.save_pretrained(root / "base")
    for method in ("ntk", "yarn"):
        extend_folder(str(root / "base"), root / method, method, 1024)
    return root


def test_swapping_the_models_keeps_every_ratio(two_extensions, tmp_path):
    from ctxext.evaluation.sections.longppl.report import _ratio
    from ctxext.evaluation.suite import load_suite, run_suite
    from ctxext.models.load import ModelSpec

    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    suite, _ = load_suite(path)
    reports = {}
    for order in (("ntk", "yarn"), ("yarn", "ntk")):
        specs = [ModelSpec(str(two_extensions / m), name=m) for m in order]
        report = run_suite(suite, specs, tmp_path / "-".join(order), show_progress=False)
        reports[order] = {m["name"]: m for m in report["models"]}
    one, two = reports[("ntk", "yarn")], reports[("yarn", "ntk")]
    own = {n: one[n]["longppl"]["by_length"]["512"]["own_key_tokens"] for n in one}
    union = one["ntk"]["longppl"]["by_length"]["512"]["key_tokens"]
    assert max(own.values()) < union  # the models' own picks differ: whoever picked alone would decide
    for name in ("ntk", "yarn"):
        assert one[name]["longppl"]["by_length"] == two[name]["longppl"]["by_length"]

    def stat(m, ref):
        cell = _ratio(m, ref, 512)  # "ratio [low, high], p = P", as report.md shows it
        ratio, rest = cell.split(" [")
        return float(ratio), float(rest.split("p = ")[1])

    forward, backward = stat(one["yarn"], one["ntk"]), stat(two["ntk"], two["yarn"])
    assert forward[0] == pytest.approx(1 / backward[0], rel=2e-3)
    assert (forward[0] > 1) == (backward[0] < 1) and (forward[1] < 0.05) == (backward[1] < 0.05)
    assert forward[1] == pytest.approx(backward[1], rel=0.05, abs=1e-3)
