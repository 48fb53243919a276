"""The typed report schema: a report written through it reads back the same; other layouts are refused by name;
the model card renders from a report written with it, with report.md's tables.

Each section's part is typed by the schema its registered section declares: the built-in sections are
registered here by importing them (as every ``ctxext`` command that reads reports does).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

import ctxext.evaluation.sections  # noqa: F401  (registers the sections' result schemas)
from ctxext.artifacts.report import SCHEMA, parse_report, read_report
from ctxext.errors import InputError


def _ppl(ppl: float, docs: int = 3, **extra: object) -> dict:
    return {"ppl": ppl, "nll": math.log(ppl), "tokens": 100 * docs, "documents": docs,
            "ci_low": ppl * 0.9, "ci_high": ppl * 1.1, **extra}  # fmt: skip


def _entry(name: str, adapter: str | None, ppls: dict[int, float], passkey: dict[tuple[int, int], list[int]]) -> dict:
    """A model entry as ``ctxext eval`` writes it (original window 256, target 1024)."""
    cells = [
        {"length": L, "depth": d, "trials": len(o), "correct": sum(o), "accuracy": sum(o) / len(o), "outcomes": o}
        for (L, d), o in passkey.items()
    ]
    by_length = {}
    for L in sorted({c["length"] for c in cells}):
        mine = [c for c in cells if c["length"] == L]
        correct, trials = sum(c["correct"] for c in mine), sum(c["trials"] for c in mine)
        by_length[str(L)] = {"correct": correct, "trials": trials, "accuracy": correct / trials,
                             "ci_low": 0.0, "ci_high": 1.0}  # fmt: skip
    total, hits = sum(c["trials"] for c in cells), sum(c["correct"] for c in cells)
    return {
        "name": name,
        "model": {"ref": "me/tiny-llama", "adapter": adapter, "config_from": None, "rope_verified": True},
        "rope": {
            "rope_type": "yarn" if adapter else "default",
            "rope_theta": 10000.0,
            "original_length": 256,
            "current_length": 1024 if adapter else 256,
            "factor": 4.0 if adapter else 1.0,
        },  # fmt: skip
        "perplexity": {
            "protocol": "truncated-document perplexity",
            "by_length": {str(L): _ppl(p, beyond_context=adapter is None and L > 256) for L, p in ppls.items()},
            "by_bucket": [{"start": 0, "end": 512, **_ppl(ppls[512])}, {"start": 512, "end": 1024, **_ppl(30.0)}],
            "short_context": {"length": 256, **_ppl(ppls[256])},
        },
        "passkey": {
            "scoring": "teacher-forced",
            "cells": cells,
            "by_length": by_length,
            "overall": {"correct": hits, "trials": total, "accuracy": hits / total, "ci_low": 0.1, "ci_high": 0.9},
        },
        "qa": {"examples": 2, "truncated": 1, "overall": {"examples": 2, "exact_match": 50.0, "f1": 62.5}},
    }


def _report() -> dict:
    return {
        "schema": SCHEMA,
        "ctxext_version": "0.0.0",
        "created": "2026-12-01T00:00:00+00:00",
        "environment": {"device": "cpu"},
        "data": {"perplexity": {"source": "builtin:stdlib"}},
        "models": [
            # Named "reference": the base is told by how it was loaded (no adapter), not by its label.
            _entry("reference", None, {256: 10.0, 512: 40.0, 1024: 90.0}, {(1024, 0): [0, 0], (1024, 100): [0, 1]}),
            _entry(
                "yarn-tuned",
                "runs/x",
                {256: 10.5, 512: 9.0, 1024: 8.0},
                {(512, 0): [1, 1], (1024, 0): [1, 0], (1024, 100): [1, 1]},
            ),  # fmt: skip
        ],
        "comparisons": {"reference": "reference", "comparisons": 0, "notes": ["nothing paired"]},
        "added_by_a_newer_ctxext": {"kept": True},
    }


def test_round_trip_write_read_same(tmp_path):
    from ctxext.evaluation.report import write_report

    raw = _report()
    raw["models"][1]["perplexity"]["by_length"]["1024"]["ci_high"] = float("nan")  # JSON has no NaN: null
    out = write_report(raw, tmp_path / "rep")
    text = (out / "report.json").read_text()
    report = read_report(out)
    # Written through the schema: reading and writing again gives the same file, field for field.
    assert report.to_json() == text
    assert read_report(out / "report.json") == report == parse_report(json.loads(text))
    data = json.loads(text)
    assert data["schema"] == SCHEMA and data["added_by_a_newer_ctxext"] == {"kept": True}
    assert data["models"][1]["perplexity"]["by_length"]["1024"]["ci_high"] is None
    assert "needle" not in data["models"][0] and "ruler" not in data["models"][0]  # tasks that did not run
    from ctxext.evaluation.sections.grids.schema import Grid
    from ctxext.evaluation.sections.perplexity.schema import Perplexity

    tuned = report.models[1]  # each section's part typed by the schema its section registered
    ppl, passkey = tuned.section("perplexity", Perplexity), tuned.section("passkey", Grid)
    assert ppl is not None and ppl.ppl_at(512) == 9.0 and ppl is tuned.model_extra["perplexity"]
    assert passkey is not None and passkey.cells[1].outcomes == [1, 0]
    assert passkey.accuracy_at(1024) == pytest.approx(0.75)
    assert not tuned.is_base and report.models[0].is_base
    # report.md is rendered from the same report with the shared tables.
    md = (out / "report.md").read_text()
    assert "| length | reference | yarn-tuned |" in md
    assert "| 1024 | 90 [81, 99] (3) † | 8 [7.2, –] (3) |" in md


@pytest.mark.parametrize(
    ("content", "message"),
    [
        # Layouts the card used to guess at; ctxext never wrote them.
        ({"model": "me/x", "perplexity": {"by_length": {"4096": {"ppl": 7.1}}}}, "is not a ctxext evaluation report"),
        ({"results": {"base": {"perplexity": {}}}}, "is not a ctxext evaluation report"),
        ({"schema": "ctxext.eval.report/v0", "models": []}, "has report schema 'ctxext.eval.report/v0'"),
        ([1, 2], "must hold a JSON object"),
        ("{not json", "is not valid JSON"),
    ],
)
def test_unknown_layouts_are_refused_with_a_clear_message(tmp_path, content, message):
    from ctxext.artifacts.run import load_report

    path = tmp_path / "report.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    for reader in (read_report, load_report):
        with pytest.raises(InputError, match=message) as info:
            reader(path)
        assert str(path) in str(info.value)


def test_damaged_fields_are_named():
    raw = _report()
    raw["models"][1]["perplexity"]["by_length"]["512"]["ppl"] = "low"
    del raw["models"][0]["rope"]["rope_theta"]
    with pytest.raises(InputError) as info:
        parse_report(raw, "r.json")
    msg = str(info.value)
    assert "models.1.perplexity.by_length.512.ppl" in msg and "models.0.rope.rope_theta" in msg
    assert "ctxext eval" in msg
    with pytest.raises(InputError, match="models"):
        parse_report({**_report(), "models": []})


def _run_folder(tmp_path: Path, report: dict) -> Path:
    # The report as `ctxext eval` writes it (report.json with each section's card part, report.md, plots).
    from ctxext.evaluation.report import write_report

    run = tmp_path / "run"
    write_report(report, run / "eval")
    info = {"status": "complete", "base_model": "me/tiny-llama", "method": "yarn", "original_length": 256,
            "target_length": 1024, "seq_len": 256, "steps": 3}  # fmt: skip
    (run / "run.json").write_text(json.dumps(info))
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 256}
    (run / "config.json").write_text(json.dumps({"rope_parameters": rope, "max_position_embeddings": 1024}))
    return run


def test_card_renders_from_a_report_built_with_the_schema(tmp_path):
    from ctxext.publish.card import build_model_card

    text = build_model_card(_run_folder(tmp_path, _report()), repo_id="me/tiny-yarn")
    card = ModelCard(text)
    # model-index: the extended model's numbers only (the base is the one loaded without an adapter).
    ppl = {r.metric_config: r.metric_value for r in card.data.eval_results if r.metric_type == "perplexity"}
    assert ppl == {"256": 10.5, "512": 9.0, "1024": 8.0}
    acc = {r.metric_config: r.metric_value for r in card.data.eval_results if r.metric_type == "accuracy"}
    assert acc == {"512": 100.0, "1024": 75.0}
    assert card.data.eval_results[0].dataset_name == "builtin:stdlib"
    # The tables of report.md, row for row.
    body = card.text
    assert "| length | reference | yarn-tuned |" in body
    assert "| 1024 | 90 [81, 99] (3) † | 8 [7.2, 8.8] (3) |" in body
    assert "| 512–1024 | 30 [27, 33] (3) | 30 [27, 33] (3) |" in body
    assert "| yarn-tuned | 256 | 10.5 [9.45, 11.6] (3) | +5.00 % |" in body  # short-context cost vs the base
    assert "| length \\ depth % | 0 | 100 | all [95 % CI] |" in body
    assert "| 1024 | 50 (2) | 100 (2) | 75 [0, 100] |" in body
    assert "| overall | EM 50.0 / F1 62.5 (2) | EM 50.0 / F1 62.5 (2) |" in body
    assert "![ppl_by_position](plots/ppl_by_position.png)" in body


def test_card_refuses_a_report_of_an_unknown_layout(tmp_path):
    from ctxext.publish.card import build_model_card

    run = _run_folder(tmp_path, _report())
    (run / "eval" / "report.json").write_text(json.dumps({"results": {"x": {"perplexity": {}}}}))
    with pytest.raises(InputError, match="is not a ctxext evaluation report"):
        build_model_card(run)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        (("perplexity", "by_length", "512", "ppl"), -3.0, "models.1.perplexity.by_length.512.ppl: Value error, -3.0 is "
         "below 1: a perplexity is exp(NLL)"),
        (("passkey", "overall", "accuracy"), 1.5, "models.1.passkey.overall.accuracy: Value error, 1.5 is above 1"),
        (("passkey", "overall", "correct"), 9, "models.1.passkey.overall: Value error, correct: 9 correct trials"),
        (("qa", "overall", "f1"), 162.5, "models.1.qa.overall.f1: Value error, 162.5 is above 100"),
        (("perplexity", "by_length", "512", "nll"), float("nan"), "models.1.perplexity.by_length.512.nll: nan"),
    ],
)  # fmt: skip
def test_values_out_of_range_are_refused_when_read_back(tmp_path, field, value, named):
    from ctxext.publish.card import build_model_card

    run = _run_folder(tmp_path, _report())
    path = run / "eval" / "report.json"
    data = json.loads(path.read_text())
    node = data["models"][1]
    for key in field[:-1]:
        node = node[key]
    node[field[-1]] = value
    path.write_text(json.dumps(data))  # Python writes NaN as the bare word NaN, which only a lenient reader takes
    for read in (lambda: read_report(path), lambda: build_model_card(run, repo_id="me/tiny-yarn")):
        with pytest.raises(InputError) as info:
            read()
        assert named in str(info.value) and str(path) in str(info.value)
    # In memory (the evaluator's own dict) a value that could not be measured may be NaN; a value out of range not.
    if value == value:
        with pytest.raises(InputError):
            parse_report(data)
    else:
        assert parse_report(data).models[1].has("perplexity")


def test_push_refuses_a_report_out_of_range(tmp_path):
    from typer.testing import CliRunner

    from ctxext.cli.commands import app

    run = _run_folder(tmp_path, _report())
    path = run / "eval" / "report.json"
    data = json.loads(path.read_text())
    data["models"][1]["perplexity"]["by_length"]["512"]["ppl"] = -3.0
    path.write_text(json.dumps(data))
    (run / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 4}))
    (run / "adapter_model.safetensors").write_bytes(b"")  # never read: the report is refused first
    result = CliRunner().invoke(app, ["push", str(run), "--repo-id", "me/tiny-yarn", "--dry-run"])
    assert result.exit_code == 2, result.output
    assert "models.1.perplexity.by_length.512.ppl" in " ".join(result.output.split())
    assert "Traceback" not in result.output
