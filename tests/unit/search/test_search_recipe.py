"""A recipe's ``search:`` section: ``ctxext validate`` accepts it, ``ctxext train`` searches (resumably) inside the
run folder, then trains with the found factors and records the search in ``run.json``."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.errors import CtxextError
from ctxext.recipe.schema import load_recipe
from ctxext.search.recipe import settings_from_recipe
from ctxext.search.run import run_search

runner = CliRunner()

# The grown model (64-token window) to 2x, a search of a few candidates without its report, one training step.
RECIPE = {
    "model": {"path": "builtin:grown-code-64-mk"},
    "rope": {"method": "longrope", "target_length": 128},
    "quantization": {"mode": "none"},
    "lora": {"r": 2, "alpha": 4},
    "data": {"path": "builtin:stdlib", "max_documents": 3, "validation_fraction": 0.3, "num_proc": 1},
    "train": {"seq_len": 128, "max_steps": 1, "loss_chunk_size": 64},
    "search": {"budget": "5m", "population": 4, "generations": 1, "samples": 2, "report": False, "window_docs": 8},
}


def _recipe(tmp_path, **changes) -> tuple:
    data = {**RECIPE, **changes, "output": {"dir": str(tmp_path / "run")}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, tmp_path / "run"


@pytest.mark.slow
def test_train_runs_the_search_first_resumably_and_records_it(tmp_path):
    path, run = _recipe(tmp_path)
    checked = runner.invoke(app, ["validate", str(path)])
    assert checked.exit_code == 0, checked.output
    # A search interrupted after 3 candidates (as Ctrl-C would) leaves its log inside the run folder.
    settings = settings_from_recipe(load_recipe(path))
    assert settings.out == run / "search"
    seen: list[int] = []

    def interrupt(cand):
        seen.append(cand.index)
        if len(seen) == 3:
            raise KeyboardInterrupt

    settings.show_progress = False
    with pytest.raises(CtxextError, match="search interrupted"):
        run_search(settings, log=lambda _: None, on_candidate=interrupt)
    assert sorted(p.name for p in run.iterdir()) == ["search"]

    # The same command again (here with --resume, as after a stop) resumes the search, then trains from scratch.
    result = runner.invoke(app, ["train", str(path), "--resume"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "replaying 3 logged candidates" in result.output and "the training starts now" in result.output
    assert "as logged" in result.output  # the attention-factor scan is read from the log, not measured again
    factors = json.loads((run / "search" / "factors.json").read_text())
    record = json.loads((run / "run.json").read_text())
    assert record["status"] == "complete"
    assert record["rope_parameters"]["long_factor"] == factors["long_factor"]
    assert record["search"]["folder"] == str(run / "search") and record["search"]["objective"] == "needle-worst"
    assert record["search"]["evaluations"] >= 4 and record["search"]["score"] is not None
    # recipe.yaml is the resolved recipe: it trains the same factors by itself, without searching again.
    saved = yaml.safe_load((run / "recipe.yaml").read_text())
    assert saved["search"] is None and saved["rope"]["long_factor"] == factors["long_factor"]
    assert load_recipe(run / "recipe.yaml").rope.long_factor == factors["long_factor"]  # the resume command's

    # A second run into the same folder is refused (it is a complete run), before any search work.
    again = runner.invoke(app, ["train", str(path)])
    text = " ".join(again.output.split())
    assert again.exit_code == 2 and "holds a complete run" in text and "--resume" not in text, text


def test_search_needs_an_empty_run_folder_and_one_process(tmp_path, monkeypatch):
    path, run = _recipe(tmp_path)
    run.mkdir()
    (run / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["train", str(path)])
    assert result.exit_code == 2 and "output.dir" in result.output and "notes.txt" in result.output
    assert sorted(p.name for p in run.iterdir()) == ["notes.txt"]
    (run / "notes.txt").unlink()
    # Under a multi-process launch the search is not run by every process: run it first, in one.
    monkeypatch.setenv("WORLD_SIZE", "2")
    from ctxext.search.recipe import search_before_training

    with pytest.raises(CtxextError, match="ctxext search --recipe RECIPE --out"):
        search_before_training(load_recipe(path), log=lambda _: None)
    assert list(run.iterdir()) == []
