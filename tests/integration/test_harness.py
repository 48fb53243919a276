"""lm-evaluation-harness on ctxext's exported tasks: lm-eval and ctxext score the same prompts trial for trial.

The grown multi-key model, extended ×4 with YaRN through ctxext's API (64 → 256 tokens), its ``multikey`` task
exported at 256 tokens (15 prompts), run by ``ctxext eval harness`` (lm-eval's ``simple_evaluate`` on the
loaded model object) and by ctxext's own greedy generation of the same prompts with the one answer match.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.evaluation.export_tasks import read_task_config
from ctxext.models.builtin import GROWN_MK_DIR

pytest.importorskip("lm_eval", reason="lm-evaluation-harness is not installed (pip install 'ctxext[harness]')")
pytestmark = pytest.mark.skipif(
    not (GROWN_MK_DIR / "model.safetensors").is_file(), reason="the multi-key grown model is not packaged"
)

runner = CliRunner()
SETTINGS = ["--tasks", "multikey", "--lengths", "256", "--depths", "10,50,90", "--trials", "5", "--templates", "0,1,2"]


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


@pytest.fixture(scope="module")
def yarn_model(tmp_path_factory) -> Path:
    from ctxext import extend_folder

    out = tmp_path_factory.mktemp("harness") / "grown-yarn4"
    extend_folder("builtin:grown-code-64-mk", out, "yarn", 256)
    return out


def _ctxext_outcomes(model: Path, docs: list[dict], budget: int, until: list[str]) -> list[int]:
    """ctxext's own scoring of the exported prompts: the tokens lm-eval feeds, greedy, the one answer match."""
    from ctxext.evaluation.export_tasks import harness_prompt_ids
    from ctxext.evaluation.sections.grids.engine import greedy_generate
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.scoring.exact_match import answer_matches

    lm = load_model(ModelSpec(str(model)), device="cpu")
    outcomes = []
    for doc in docs:
        [text] = greedy_generate(lm, [harness_prompt_ids(lm.tokenizer, doc["prompt"])], budget)
        outcomes.append(int(answer_matches(text, doc["answer"], until)))
    return outcomes


@pytest.mark.slow
def test_lm_eval_scores_exported_prompts_trial_for_trial_as_ctxext(yarn_model, tmp_path):
    export, report_dir = tmp_path / "tasks", tmp_path / "report"
    result = run("tasks", "export", str(export), "--model", str(yarn_model), *SETTINGS)
    assert result.exit_code == 0, result.output
    name = "ctxext_multikey_256"
    config = read_task_config(export / f"{name}.yaml")
    assert config["dataset_path"] == "json" and config["output_type"] == "generate_until"
    docs = [json.loads(line) for line in (export / f"{name}.jsonl").read_text().splitlines()]
    assert len(docs) == 15

    result = run(
        "eval", "harness", "--model", str(yarn_model), "--include-path", str(export), "--tasks", "ctxext_multikey",
        "--out", str(report_dir), "--quiet", "--device", "cpu",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    section = json.loads((report_dir / "report.json").read_text())["models"][0]["harness"]
    harness = [int(x) for x in section["tasks"][name]["outcomes"]]
    gen = config["generation_kwargs"]
    ours = _ctxext_outcomes(yarn_model, docs, gen["max_gen_toks"], gen["until"])
    assert harness == ours
    assert 0 < sum(ours) < len(ours), ours  # both outcomes occur: the comparison could fail
    assert section["tasks"][name]["metrics"]["exact_match"] == pytest.approx(sum(ours) / len(ours))
    assert name in (report_dir / "report.md").read_text()


def test_harness_exports_ctxext_tasks_first_with_lengths(yarn_model, tmp_path):
    """``--lengths``: the section exports the named ctxext tasks (the first model's tokenizer), runs their tags, and
    removes the export; the report says what was exported."""
    from ctxext.evaluation.sections import SECTIONS

    out = tmp_path / "report"
    args = ["--tasks", "multikey", "--lengths", "256", "--depths", "50", "--trials", "2", "--templates", "0"]
    result = run("eval", "harness", "--model", str(yarn_model), *args, "--out", str(out), "--quiet")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    task = report["models"][0]["harness"]["tasks"]["ctxext_multikey_256"]
    assert task["documents"] == 2 and len(task["outcomes"]) == 2
    export = report["data"]["harness"]["export"]
    assert export["tokenizer_of"] == str(yarn_model) and export["settings"]["lengths"] == [256]
    assert report["suite"]["definition"]["harness"]["tasks"] == ["multikey"]  # the suite as given, not the tags
    assert SECTIONS["harness"]._folder is None  # the temporary export is gone
    bad = run("eval", "harness", "--model", str(yarn_model), "--tasks", "hellaswag", "--lengths", "256",
              "--out", str(tmp_path / "bad"))  # fmt: skip
    assert bad.exit_code == 2 and "names none of them" in " ".join(bad.output.split())
    assert not (tmp_path / "bad").exists()


def test_exported_prompts_are_the_grid_samples(yarn_model, tmp_path):
    """The documents are the retrieval grid's own seeded samples for the model's tokenizer, decoded."""
    from ctxext.evaluation.export_tasks import export_lm_eval
    from ctxext.evaluation.sections.grids.engine import GridSettings, text_haystack
    from ctxext.evaluation.sections.ruler.engine import RulerSettings, RulerTaskSpec
    from ctxext.models.load import load_tokenizer_and_config
    from ctxext.tasks.samples import make_samples

    settings = RulerSettings(
        tasks=[RulerTaskSpec(task="needle")], lengths=[128], depths=[0, 100], trials=3, templates=[0]
    )
    export_lm_eval(str(yarn_model), tmp_path / "t", settings)
    docs = [json.loads(x) for x in (tmp_path / "t" / "ctxext_needle_128.jsonl").read_text().splitlines()]
    tok, _ = load_tokenizer_and_config(str(yarn_model))
    hay = text_haystack(tok, settings.haystack, settings.text_field, settings.split, 256)
    grid = GridSettings(lengths=[128], depths=[0, 100], trials=3)
    samples = [
        s
        for d in (0, 100)
        for s in make_samples(tok, "needle", hay, 128, d, trials=grid.trials, seed=grid.seed, template=[0])
    ]
    assert [d["prompt"] for d in docs] == [tok.decode(s.prompt, skip_special_tokens=False) for s in samples]
    assert [d["answer"] for d in docs] == [s.answer for s in samples]
    assert all(d["prompt"].startswith(tok.bos_token) for d in docs)


@pytest.mark.slow  # indexes all of lm-eval's tasks (~8 CPU s)
def test_unknown_task_is_named(yarn_model, tmp_path):
    """Exit 2 before any model is loaded, with lm-eval's close matches."""
    out = tmp_path / "a"
    result = run("eval", "harness", "--model", str(yarn_model), "--tasks", "lambada_opena", "--out", str(out))
    assert result.exit_code == 2 and "lambada_opena" in result.output and "lambada_openai" in result.output
    assert not (tmp_path / "a").exists()


def test_missing_data_set_is_named_at_once(yarn_model, tmp_path):
    """A task whose Hub data set is not in the local cache: exit 2 naming it (HF_HUB_OFFLINE=1: no retries)."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    config = {
        "task": "needs_the_hub",
        "dataset_path": "ctxext-tests/not-cached",
        "output_type": "generate_until",
        "test_split": "test",
        "doc_to_text": "q",
        "doc_to_target": "a",
        "metric_list": [{"metric": "exact_match"}],
    }
    (tasks / "needs_the_hub.yaml").write_text(yaml.safe_dump(config))
    result = run("eval", "harness", "--model", str(yarn_model), "--include-path", str(tasks), "--tasks",
                 "needs_the_hub", "--out", str(tmp_path / "b"))  # fmt: skip
    assert result.exit_code == 2 and "ctxext-tests/not-cached" in result.output, result.output
    assert not (tmp_path / "b").exists()


def test_export_refuses_lengths_beyond_the_context(yarn_model, tmp_path):
    result = run("tasks", "export", str(tmp_path / "x"), "--model", str(yarn_model), "--tasks", "needle",
                 "--lengths", "512")  # fmt: skip
    assert result.exit_code == 2 and "512" in result.output and "--allow-beyond-context" in result.output
    assert not (tmp_path / "x").exists()
