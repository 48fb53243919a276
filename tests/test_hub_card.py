"""The model card: Hub metadata (model-index) and prose, built from a real tiny run and its measured report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from _hub_helpers import copy_run, shared_merge, shared_run
from huggingface_hub import ModelCard

from ctxext.publish.card import build_model_card


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_model_dir) -> Path:
    return shared_run(tmp_path_factory, tiny_model_dir)


def _cell(e: dict) -> str:
    # A perplexity cell of report.md and the card: ppl [95 % CI] (documents).
    return f"{e['ppl']:.3g} [{e['ci_low']:.3g}, {e['ci_high']:.3g}] ({e['documents']})"


def _extended(run_dir: Path):
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    return next(m for m in report["models"] if m["name"] != "base"), report


def test_card_metadata_parses_back_with_model_index(tiny_run):
    card = ModelCard(build_model_card(tiny_run, repo_id="me/tiny-llama-yarn-1k"))
    data = card.data
    assert data.base_model == "me/tiny-llama"
    assert data.library_name == "peft"
    assert {"context-extension", "yarn"} <= set(data.tags)
    assert data.model_name == "tiny-llama-yarn-1k"

    extended, _ = _extended(tiny_run)
    results = data.eval_results
    ppl = {r.metric_config: r for r in results if r.metric_type == "perplexity"}
    assert set(ppl) == set(extended["perplexity"]["by_length"])
    for length, entry in extended["perplexity"]["by_length"].items():
        assert ppl[length].metric_value == pytest.approx(entry["ppl"], abs=1e-4)
        assert ppl[length].task_type == "text-generation"
        assert ppl[length].metric_name == f"Perplexity @ {length} tokens"
    passkey = [r for r in results if r.metric_type == "accuracy"]
    cells = extended["passkey"]["cells"]
    assert {r.metric_config for r in passkey} == {str(c["length"]) for c in cells}
    for r in passkey:
        accs = [c["accuracy"] for c in cells if str(c["length"]) == r.metric_config]
        assert r.metric_value == pytest.approx(100 * sum(accs) / len(accs))
        assert r.dataset_type == "passkey"
    # The base model's numbers are in the tables but not claimed as this model's results.
    assert len(results) == len(ppl) + len(passkey)


def test_card_prose_has_rope_recipe_tables_and_loading(tiny_run):
    text = build_model_card(tiny_run, repo_id="me/tiny-llama-yarn-1k")
    body = text.split("---", 2)[2]
    config = json.loads((tiny_run / "config.json").read_text())
    run = json.loads((tiny_run / "run.json").read_text())
    # Every rope parameter, the lengths and the factor.
    for key, value in config["rope_parameters"].items():
        assert f"| rope_parameters.{key} | `{json.dumps(value)}` |" in body
    assert "| original context | 256 |" in body and "| extended context | 1024 |" in body
    assert "| factor | 4 |" in body
    # Training recipe.
    assert f"| steps | {run['steps']} |" in body
    assert "| LoRA rank / alpha / dropout | 8 / 16 / 0.0 |" in body
    assert "| trained in full | embed_tokens, norm |" in body
    # Evaluation tables from the report, the plot, and the short-context cost against the base.
    extended, report = _extended(tiny_run)
    base = next(m for m in report["models"] if m["name"] == "base")
    assert "| length | base | fine-tuned |" in body
    # The base evaluated beyond its 256-token context is marked †.
    at_1k = [m["perplexity"]["by_length"]["1024"] for m in (base, extended)]
    assert f"| 1024 | {_cell(at_1k[0])} † | {_cell(at_1k[1])} |" in body
    assert "![ppl_by_position](plots/ppl_by_position.png)" in body
    b, e = base["perplexity"]["short_context"], extended["perplexity"]["short_context"]
    assert f"| fine-tuned | 256 | {_cell(e)} | {100 * (e['ppl'] / b['ppl'] - 1):+.2f} % |" in body
    assert "| 768–1024 |" in body  # position buckets
    assert "| length \\ depth % | 0 | 100 | all [95 % CI] |" in body
    cells = {c["depth"]: c["accuracy"] for c in extended["passkey"]["cells"] if c["length"] == 1024}
    mean = sum(cells.values()) / len(cells)
    assert f"| 1024 | {100 * cells[0]:.0f} (1) | {100 * cells[100]:.0f} (1) | {100 * mean:.0f} [" in body
    # Loading: the patched config must be passed; serving: the exact rope_parameters JSON and length.
    assert 'config = AutoConfig.from_pretrained("me/tiny-llama-yarn-1k")' in body
    assert 'PeftModel.from_pretrained(base, "me/tiny-llama-yarn-1k")' in body
    block = re.search(r"```json\n(.*?)\n```", body, re.S)
    assert block and json.loads(block.group(1)) == config["rope_parameters"]
    overrides = re.search(r"--hf-overrides '(.*?)'", body)
    assert overrides and json.loads(overrides.group(1))["rope_parameters"] == config["rope_parameters"]
    assert "--max-model-len 1024" in body


def test_merged_card_says_transformers_and_reports_the_merge_check(tmp_path_factory, tiny_model_dir):
    merged, result = shared_merge(tmp_path_factory, tiny_model_dir)
    card = ModelCard(build_model_card(merged, repo_id="me/tiny-merged"))
    assert card.data.library_name == "transformers"
    assert "lora" not in card.data.tags
    assert card.data.eval_results  # the run's report travelled with the merged folder
    assert "## Merge check" in card.text
    assert f"max |Δlogit| = {result.max_abs_diff:.3g}" in card.text
    assert 'AutoModelForCausalLM.from_pretrained("me/tiny-merged"' in card.text


def test_card_without_reports_has_no_model_index(tiny_run):
    card = ModelCard(build_model_card(tiny_run, reports=[]))
    assert card.data.eval_results is None
    assert "No evaluation report was published" in card.text
    assert "Not measured" in card.text


def test_card_from_a_ctxext_eval_report_with_base_comparison(tiny_run, tmp_path):
    """The report ``ctxext train`` writes at the end (eval suite, base and patched-only compared) feeds the card."""
    from ctxext.evaluation.suite import run_suite_for_run
    from ctxext.recipe.schema import load_recipe

    run = copy_run(tiny_run, tmp_path / "run")
    shutil.rmtree(run / "eval")
    # eval/tiny-cpu.yaml cut down to what the card reads, to keep this test short on two busy cores.
    suite = tmp_path / "suite.yaml"
    suite.write_text(
        "name: hub-card\nallow_beyond_context: true\n"
        "perplexity: {data: builtin:stdlib, lengths: ['1x', '2x'], bucket_size: auto, max_docs: 4, resamples: 100}\n"
        "passkey: {lengths: ['1x'], depths: [0, 100], trials: 1, max_new_tokens: 8}\n"
    )
    recipe = load_recipe(run / "recipe.yaml", [f"eval.suite={suite}", "eval.compare_base=true"])
    run_suite_for_run(run, recipe, show_progress=False)
    report = json.loads((run / "eval" / "report.json").read_text())
    fine = next(m for m in report["models"] if m["name"] == "fine-tuned")
    base = next(m for m in report["models"] if m["name"] == "base")

    card = ModelCard(build_model_card(run, repo_id="me/tiny-llama-yarn-1k"))
    ppl = {r.metric_config: r.metric_value for r in card.data.eval_results if r.metric_type == "perplexity"}
    assert ppl == {k: round(v["ppl"], 4) for k, v in fine["perplexity"]["by_length"].items()}
    passkey = {r.metric_config: r.metric_value for r in card.data.eval_results if r.metric_type == "accuracy"}
    assert passkey == {k: round(100 * v["accuracy"], 2) for k, v in fine["passkey"]["by_length"].items()}
    assert card.data.eval_results[0].dataset_name == "builtin:stdlib"
    b, e = base["perplexity"]["short_context"], fine["perplexity"]["short_context"]
    assert f"| fine-tuned | {e['length']} | {_cell(e)} | {100 * (e['ppl'] / b['ppl'] - 1):+.2f} % |" in card.text
    assert "Passkey accuracy, fine-tuned:" in card.text
    for png in (run / "eval").glob("*.png"):
        assert f"(plots/{png.name})" in card.text
