"""``ctxext demo --quick`` end to end: grown model → unpatched at 4× → YaRN, llama3 → nf4 QLoRA → one report."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.models.builtin import GROWN_MK_DIR

pytestmark = pytest.mark.skipif(
    not (GROWN_MK_DIR / "model.safetensors").is_file(), reason="the demo's grown model is not packaged"
)


@pytest.mark.slow  # the whole demo: extend, train, evaluate three models
def test_demo_quick_end_to_end(tmp_path, cache_root):
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report" / "report.json").read_text())
    names = [m["name"] for m in report["models"]]
    assert names == ["base", "yarn×4", "llama3×4", "llama3×4+QLoRA mix"]
    assert json.loads((out / "finetuned" / "run.json").read_text())["status"] == "complete"
    assert (out / "patched-yarn" / "config.json").is_file() and (out / "patched-llama3" / "config.json").is_file()
    base, patched, _, tuned = report["models"]
    # The grown model retrieves its in-domain needle inside its 64-token window ...
    assert base["needle"]["by_length"]["64"]["accuracy"] >= 0.8
    # ... and not at 4× its window unpatched, where its numbers are marked as beyond its context.
    assert base["needle"]["by_length"]["256"]["accuracy"] <= 0.5
    assert base["perplexity"]["by_length"]["256"]["beyond_context"]
    assert not patched["perplexity"]["by_length"]["256"].get("beyond_context")
    for model in report["models"]:
        assert {"64", "128", "256"} <= set(model["perplexity"]["by_length"])
        assert len(model["perplexity"]["by_bucket"]) == 8
    assert "needle@256" in result.output and "2 keys@256" in result.output and "report:" in result.output
    mixture = json.loads((out / "finetuned" / "mixture.json").read_text())["realised"]
    assert {s["source"] for s in mixture["sources"]} == {"builtin:stdlib", "task:needle", "short:builtin:stdlib"}
    for model in report["models"]:
        assert {"multikey-2", "needle-heldout-form"} <= set(model["ruler"]["tasks"])
    assert (out / "report" / "ppl_by_position.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second run reuses every step (the cache) and prints the same table.
    again = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out)], catch_exceptions=False)
    assert again.exit_code == 0 and "cached" in again.output


def test_demo_mixture_has_multikey_rows_only_when_asked(tmp_path):
    from ctxext.cli.demo import DemoSettings, finetune_recipe, training_mixture

    default = training_mixture(DemoSettings(), 64)
    assert [(m.get("task") or m["path"], m["weight"]) for m in default] == [("builtin:stdlib", 0.5), ("needle", 0.5)]
    mixed = {m.get("task") or m["path"]: m for m in training_mixture(DemoSettings(multikey_share=0.5), 64)}
    assert mixed["needle"]["weight"] == mixed["multikey"]["weight"] == 0.25
    assert mixed["multikey"]["distractors"] == 2 and mixed["multikey"]["min_length"] == 128
    # The recipe built from it validates (weights, task names, lengths that fit the multi-key prompt).
    recipe = finetune_recipe(DemoSettings(multikey_share=0.5), 64, 256, tmp_path / "run")
    assert [m.task for m in recipe.data.mixture if m.task] == ["needle", "multikey"]
