"""``ctxext demo``: its packaged recipe, its overrides, and ``--quick`` end to end (grown model → unpatched at 4×
→ YaRN, llama3 → nf4 QLoRA → one report)."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.models.builtin import GROWN_MK_DIR

pytestmark = pytest.mark.skipif(
    not (GROWN_MK_DIR / "model.safetensors").is_file(), reason="the demo's grown model is not packaged"
)


def _flat(result) -> str:
    return " ".join(result.output.split())


@pytest.mark.slow  # the whole demo: extend, train, evaluate three models
def test_demo_quick_end_to_end(tmp_path, cache_root):
    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report" / "report.json").read_text())
    names = [m["name"] for m in report["models"]]
    assert names == ["base", "yarn×4", "llama3×4", "llama3×4+QLoRA mix"]
    assert json.loads((out / "finetuned" / "run.json").read_text())["status"] == "complete"
    # The run's resolved recipe is the packaged file with --quick's overrides, in the demo's folder.
    recipe = yaml.safe_load((out / "finetuned" / "recipe.yaml").read_text())
    assert (recipe["train"]["max_steps"], recipe["train"]["micro_batch_size"], recipe["data"]["max_documents"]) == (
        6,
        2,
        40,
    )
    assert recipe["output"]["dir"] == str(out / "finetuned") and recipe["train"]["learning_rate"] == 1e-3
    assert report["suite"]["definition"]["needle"]["trials"] == 2
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
    # Under the tables, the fine-tune read against the base's own window, depth by depth, with its verdict.
    flat = _flat(result)
    assert "relative target (docs/evaluation.md): llama3×4+QLoRA mix at 256 tokens against the base at 64" in flat
    assert all(f"depth {d} %:" in flat for d in (10, 30, 50, 70, 90)) and "in its window:" in flat
    assert "→ " in flat and "2 prompts per depth" in flat
    assert "## Relative target" in (out / "report" / "report.md").read_text()  # and in report.md, every extension
    mixture = json.loads((out / "finetuned" / "mixture.json").read_text())["realised"]
    assert {s["source"] for s in mixture["sources"]} == {"builtin:stdlib", "task:needle", "short:builtin:stdlib"}
    for model in report["models"]:
        assert {"multikey-2", "needle-heldout-form"} <= set(model["ruler"]["tasks"])
    assert (out / "report" / "ppl_by_position.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second run reuses every step (the cache) and prints the same table.
    again = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out)], catch_exceptions=False)
    assert again.exit_code == 0 and "cached" in again.output
    # Other settings are not answered from that cache: the run would show another recipe's or suite's numbers.
    before = (out / "finetuned" / "run.json").read_text()
    for override, named in (("train.max_steps=5", "train.max_steps: 6 → 5"), ("needle.trials=3", "(needle)")):
        other = CliRunner().invoke(app, ["demo", "--quick", "--out", str(out), override])
        assert other.exit_code == 2 and named in _flat(other) and "--fresh" in _flat(other), other.output
    assert (out / "finetuned" / "run.json").read_text() == before


def test_packaged_recipe_validates_and_prints_as_shipped(tmp_path, cache_root):
    from ctxext.cli.demo import RECIPE
    from ctxext.recipe.schema import load_recipe

    result = CliRunner().invoke(app, ["validate", str(RECIPE)])
    assert result.exit_code == 0 and "llama3 → 256" in _flat(result), result.output
    printed = CliRunner().invoke(app, ["demo", "--print-recipe"])
    assert printed.exit_code == 0 and printed.stdout == RECIPE.read_text()
    copy = tmp_path / "demo.yaml"
    copy.write_text(printed.stdout)
    recipe = load_recipe(copy)
    assert (recipe.model.path, recipe.rope.method, recipe.rope.target_length) == (
        "builtin:grown-code-64-mk",
        "llama3",
        256,
    )
    # The mixture: code and single-key needle rows, half each; multi-key rows only when a recipe adds them.
    assert [(m.task or m.path, m.weight) for m in recipe.data.mixture] == [("builtin:stdlib", 0.5), ("needle", 0.5)]
    refused = CliRunner().invoke(app, ["demo", "--print-recipe", "--quick"])
    assert refused.exit_code == 2 and "--print-recipe" in _flat(refused)


def test_overrides_reach_the_recipe_and_the_suite_after_quick(tmp_path, cache_root):
    from ctxext.cli.demo import resolve_demo

    multikey = "{task: multikey, weight: 0.25, distractors: 2, min_length: 128, templates: [0, 1, 2]}"
    run = resolve_demo(
        tmp_path / "demo",
        ["train.max_steps=7", "needle.trials=3", "rope.target_length=512", f"data.mixture.2={multikey}"],
        quick=True,
    )
    assert run.recipe.train.max_steps == 7 and run.recipe.train.micro_batch_size == 2  # the user's key wins
    assert run.suite.needle.trials == 3 and run.suite.ruler.trials == 2
    assert (run.target, run.factor, run.recipe.seq_len) == (512, "8", 512)
    assert [m.task for m in run.recipe.data.mixture if m.task] == ["needle", "multikey"]
    assert run.recipe.output.dir == str(tmp_path / "demo" / "finetuned")
    plain = resolve_demo(tmp_path / "demo", plain=True)
    assert plain.recipe.data.mixture is None and plain.recipe.data.path == "builtin:stdlib" and plain.kind == "plain"
    assert plain.run_dir == tmp_path / "demo" / "finetuned-plain"
    assert not (tmp_path / "demo").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["trian.max_steps=5"], "trian.max_steps: neither a recipe key"),
        (["train.max_steps=0"], "train.max_steps: Input should be greater than 0"),
        (["output.dir=elsewhere"], "output.dir: the demo writes its fine-tune to <--out>/finetuned"),
        (["needle.trails=3"], "needle.trails"),
        (["--reference", "yarm"], "--reference: unknown method 'yarm'"),
    ],
)
def test_bad_input_exits_2_naming_it_and_writes_nothing(tmp_path, cache_root, args, named):
    result = CliRunner().invoke(app, ["demo", "--quick", "--out", str(tmp_path / "demo"), *args])
    assert result.exit_code == 2 and named in _flat(result), result.output
    assert "Traceback" not in result.output and list(tmp_path.iterdir()) == []


def test_a_fine_tune_that_will_not_fit_is_refused_before_anything_is_written(tmp_path, cache_root):
    out = tmp_path / "demo"
    overrides = ["train.micro_batch_size=20000", "train.memory.fit_micro_batch=false"]  # not fitted: as given
    result = CliRunner().invoke(app, ["demo", "--out", str(out), *overrides])
    text = _flat(result)
    assert result.exit_code == 2, result.output
    assert "will probably run out of memory" in text and "train.micro_batch_size=1" in text
    assert "train.gradient_accumulation_steps=20000" in text  # the batch kept, as a value the user can paste
    assert "ctxext plan" in text and "Traceback" not in text
    assert not out.exists()
