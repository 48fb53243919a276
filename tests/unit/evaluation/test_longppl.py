"""LongPPL (perplexity on the tokens that need the far context): the key-token rule and the suite section.

The grown multi-key model (64-token window) retrieves a ``KEY_ab = 48213`` line it saw ~50 tokens back; cut to
a 16-token context it cannot. Its answer tokens are the tokens whose log-probability the far context raises:
they must be the key tokens, and the rule is checked against a scoring written independently here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from ctxext.models.builtin import GROWN_MK_DIR
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(
    not (GROWN_MK_DIR / "model.safetensors").is_file(), reason="the multi-key grown model is not packaged"
)

K, S = 16, 4  # short context and window step: short windows of 20 tokens moved by 4


@pytest.fixture(scope="module")
def grown():
    from ctxext.models.load import ModelSpec, load_model

    return load_model(ModelSpec("builtin:grown-code-64-mk"), device="cpu")


def _copy_case(tok) -> tuple[list[int], list[int]]:
    """64 tokens: a key line after BOS, real code as filler, then the assert that copies the key; answer positions."""
    import inspect
    import textwrap

    from ctxext.tasks.base import encode, encode_prefix

    head = encode_prefix(tok, "\nKEY_ab = 48213\n")
    question, answer = encode(tok, "\nassert KEY_ab =="), encode(tok, " 48213")
    filler = encode(tok, inspect.getsource(textwrap)[3000:6000])
    fill = 64 - len(head) - len(question) - len(answer)
    ids = head + filler[:fill] + question + answer
    return ids, list(range(64 - len(answer), 64))


@torch.no_grad()
def _nll_by_hand(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Full-context NLLs (one plain forward, full logits) and short-context NLLs, each token its own forward.

    Token t's short window is the one the reference code gives it: windows [b, b + K + S) for b = 0, S, 2S …,
    the first that reaches t; it sees t − b tokens (K to K + S − 1 once t ≥ K + S).
    """
    x = torch.tensor(ids)
    full = F.cross_entropy(model(x[None]).logits[0, :-1].float(), x[1:], reduction="none")
    short = torch.empty_like(full)
    for t in range(1, len(ids)):
        b = 0
        while b + K + S <= t:
            b += S
        logits = model(x[None, b:t]).logits[0, -1].float()
        short[t - 1] = F.cross_entropy(logits[None], x[t : t + 1])
    return full, short


def test_key_tokens_are_the_far_copies(grown):
    from ctxext.evaluation.sections.longppl.engine import select_key_tokens
    from ctxext.scoring.nll import sliding_nll, token_nll

    ids, answer = _copy_case(grown.tokenizer)
    full, short = _nll_by_hand(grown.model, ids)
    expected = [t for t in range(1, 64) if short[t - 1] - full[t - 1] > 2 and -full[t - 1] > -2]
    x = torch.tensor(ids)
    lib_full, lib_short = token_nll(grown.model, x[None])[0], sliding_nll(grown.model, x, K + S, S)
    assert torch.allclose(lib_full, full, atol=1e-4) and torch.allclose(lib_short, short, atol=1e-4)
    keys = select_key_tokens(lib_full, lib_short, 2.0, -2.0).tolist()
    assert keys == expected
    # The copied key's digits: predicted from 50 tokens back (NLL < 2), not from 16 (gain > 2 nats) …
    digits = [t for t in answer if grown.tokenizer.decode([ids[t]]).strip() in ("4", "21", "3")]
    assert digits and set(digits) <= set(keys), (keys, answer)
    # … and hardly any other token needs the far context (the tokens of the first window never: gain 0).
    assert all(t >= K + S for t in keys) and len(keys) <= 8
    # Thresholds decide: α above every gain selects nothing; β = 0 keeps only certain tokens.
    assert select_key_tokens(lib_full, lib_short, float((lib_short - lib_full).max()) + 1, -2.0).numel() == 0
    assert set(select_key_tokens(lib_full, lib_short, 2.0, -0.01).tolist()) <= set(keys)


@pytest.fixture(scope="module")
def yarn(tmp_path_factory) -> Path:
    from ctxext import extend_folder

    out = tmp_path_factory.mktemp("longppl") / "grown-yarn4"
    extend_folder("builtin:grown-code-64-mk", out, "yarn", 256)
    return out


def _copy_docs(path: Path) -> Path:
    """Three code documents that each set a key near the top and assert it ~70 tokens later."""
    import inspect
    import textwrap

    source = inspect.getsource(textwrap)
    rows = []
    for i, (name, key) in enumerate([("ab", 48213), ("cd", 90517), ("ef", 36284)]):
        filler = source[2000 + 900 * i : 2000 + 900 * i + 220]
        rows.append({"text": f"KEY_{name} = {key}\n{filler}\nassert KEY_{name} == {key}\n{source[:600]}"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SUITE = """
name: longppl-test
longppl:
  data: docs.jsonl
  lengths: ["2x"]
  short_context: 16
  stride: 4
  max_docs: 3
  resamples: 50
"""


def test_section_runs_from_a_suite_with_the_union_of_key_tokens(yarn, tmp_path):
    from ctxext.artifacts.report import read_report
    from ctxext.evaluation.suite import load_suite, run_suite
    from ctxext.models.load import ModelSpec, load_model

    path = tmp_path / "suite.yaml"
    path.write_text(SUITE)
    _copy_docs(tmp_path / "docs.jsonl")
    suite, _ = load_suite(path)
    specs = [ModelSpec("builtin:grown-code-64-mk", name="base"), ModelSpec(str(yarn), name="yarn")]
    report = run_suite(suite, specs, tmp_path / "rep", show_progress=False)
    base, ext = (m["longppl"] for m in report["models"])
    # Both models picked; the scored set is the union of their own key tokens, the same for both.
    assert base["key_selection"] == ext["key_selection"] == "union" and base["selectors"] == ["base", "yarn"]
    b, e = base["by_length"]["128"], ext["by_length"]["128"]
    assert b["key_tokens"] == e["key_tokens"] > 0 and b["scored_tokens"] == e["scored_tokens"] == 3 * 127
    assert max(b["own_key_tokens"], e["own_key_tokens"]) <= e["key_tokens"] <= b["own_key_tokens"] + e["own_key_tokens"]
    assert b["beyond_context"] and not e["beyond_context"]
    positions = ext["per_document"]["by_length"]["128"]["key_positions"]
    assert positions == base["per_document"]["by_length"]["128"]["key_positions"]
    assert sum(map(len, positions)) == e["key_tokens"] and all(p >= K + S for ps in positions for p in ps)
    # Each model's LongPPL and perplexity, recomputed here: the same documents, plain full-logits forwards;
    # the reference code's aggregation (per-document values, key-token / token weights) and the pooled one.
    from ctxext.scoring.documents import tokenize_documents
    from ctxext.scoring.texts import iter_texts

    for spec, got in zip(specs, (b, e), strict=True):
        lm = load_model(spec, device="cpu")
        docs = tokenize_documents(iter_texts(str(tmp_path / "docs.jsonl")), lm.tokenizer, 128, 3, 128).ids
        key_nll, all_nll = [], []
        with torch.no_grad():
            for doc, pos in zip(docs, positions, strict=True):
                x = doc[:128]
                nll = F.cross_entropy(lm.model(x[None]).logits[0, :-1].float(), x[1:], reduction="none")
                key_nll.append([float(nll[p - 1]) for p in pos])
                all_nll.append(nll.tolist())
        keyed = [d for d in key_nll if d]
        official = sum(len(d) * math.exp(sum(d) / len(d)) for d in keyed) / sum(map(len, keyed))
        pooled = math.exp(sum(map(sum, keyed)) / sum(map(len, keyed)))
        assert got["longppl"]["ppl"] == pytest.approx(official, rel=1e-4)
        assert got["longppl_pooled"]["ppl"] == pytest.approx(pooled, rel=1e-4) and pooled <= official * (1 + 1e-9)
        ppl = sum(len(d) * math.exp(sum(d) / len(d)) for d in all_nll) / sum(map(len, all_nll))
        assert got["ppl"]["ppl"] == pytest.approx(ppl, rel=1e-4)
        assert got["ppl_pooled"]["ppl"] == pytest.approx(math.exp(sum(map(sum, all_nll)) / (3 * 127)), rel=1e-4)
    # The report reads back through the schema, and report.md has the table with the paired ratio.
    assert read_report(tmp_path / "rep").models[1].longppl.by_length["128"].key_tokens == e["key_tokens"]
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "LongPPL" in md and "union of every model's own (**base**, **yarn**)" in md and "(reference)" in md


runner = CliRunner()


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("  lsd_threshold: -1\n", "longppl.lsd_threshold"),
        ("  lcl_threshold: 0.5\n", "longppl.lcl_threshold"),
        ("  evaluator: nope\n", "longppl.evaluator"),
        ("  short_context: 128\n", "longppl.short_context"),
        ("  treshold: 2\n", "longppl.treshold"),
    ],
)
def test_bad_settings_exit_2_naming_the_key(tiny_model_dir, tmp_path, extra, key):
    from ctxext.cli.commands import app

    path = tmp_path / "suite.yaml"
    path.write_text("name: bad\nlongppl:\n  lengths: [128]\n  data: builtin:stdlib\n" + extra)
    out = tmp_path / "out"
    res = runner.invoke(app, ["eval", "run", str(path), "--model", str(tiny_model_dir), "--out", str(out)])
    assert res.exit_code == 2, res.output
    assert key in " ".join(res.output.split()) and "Traceback" not in res.output
    assert not out.exists() or not any(out.iterdir())


def test_old_reports_without_longppl_still_read(tmp_path):
    from ctxext.artifacts.report import SCHEMA, parse_report

    entry = {
        "name": "m",
        "rope": {"rope_type": "default", "rope_theta": 1e4, "original_length": 64, "current_length": 64},
    }
    report = parse_report({"schema": SCHEMA, "models": [entry]})
    assert not report.models[0].has("longppl") and "longppl" not in json.loads(report.to_json())["models"][0]


def test_the_default_suite_means_something():
    """eval/long-context.yaml: keyed held-out retrieval with a control, cells that separate 50 % from 90 %, LongPPL."""
    from ctxext.evaluation.sections.longppl.engine import resolve_run
    from ctxext.evaluation.suite import load_suite
    from ctxext.scoring.stats import wilson_interval

    suite, _ = load_suite(ROOT / "eval" / "long-context.yaml")
    ruler = suite.ruler
    assert ruler is not None and ruler.control and ruler.templates == "heldout" and suite.needle is None
    assert {t.task for t in ruler.tasks} == {"needle", "multikey", "json_kv", "doc_qa"}
    n = ruler.trials
    assert wilson_interval(round(0.5 * n), n)[1] < wilson_interval(round(0.9 * n), n)[0]
    assert suite.passkey is not None and suite.passkey.trials >= 20
    longppl = (suite.__pydantic_extra__ or {})["longppl"]
    run = resolve_run(longppl, ("base", "extended"), 4096, 32768)  # Llama-2 4k → 32k: the paper's K and S
    assert (run.short_context, run.stride, run.evaluator) == (4096, 1024, None)
