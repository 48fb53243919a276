"""The model card: Hub metadata (model-index) and prose, built from a real tiny run and the report its eval suite wrote.

The shared run's report is the one ``ctxext train`` writes with ``eval.compare_base``: base, patched only and
fine-tuned, evaluated side by side (see ``_hub_helpers``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from ctxext.publish.card import build_model_card
from tests.helpers.hub import shared_merge, shared_run


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_model_dir) -> Path:
    return shared_run(tmp_path_factory, tiny_model_dir)


def _cell(e: dict) -> str:
    # A perplexity cell of report.md and the card: ppl [95 % CI] (documents).
    return f"{e['ppl']:.3g} [{e['ci_low']:.3g}, {e['ci_high']:.3g}] ({e['documents']})"


def _extended(run_dir: Path):
    # The card's numbers are the fine-tuned model's (the last model, after the patched-only one).
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["base", "patched only", "fine-tuned"]
    return report["models"][-1], report


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
    assert {r.dataset_name for r in ppl.values()} == {"builtin:stdlib"}
    passkey = [r for r in results if r.metric_type == "accuracy"]
    cells = extended["passkey"]["cells"]
    assert {r.metric_config for r in passkey} == {str(c["length"]) for c in cells} == {"512", "1024"}
    for r in passkey:
        accs = [c["accuracy"] for c in cells if str(c["length"]) == r.metric_config]
        assert r.metric_value == pytest.approx(100 * sum(accs) / len(accs))
        assert r.metric_value == round(100 * extended["passkey"]["by_length"][r.metric_config]["accuracy"], 2)
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
    # Training recipe, as train recorded it: the LoRA settings and every module it trained in full.
    assert f"| steps | {run['steps']} |" in body and run["steps"] == 3
    assert {k: run["lora"][k] for k in ("r", "alpha", "dropout")} == {"r": 8, "alpha": 16, "dropout": 0}
    assert "| LoRA rank / alpha / dropout | 8 / 16.0 / 0.0 |" in body  # alpha is a float in the recipe schema
    assert {"model.embed_tokens", "model.norm", "model.layers.0.input_layernorm"} <= set(run["extra_trainable"])
    assert f"| trained in full | {', '.join(run['extra_trainable'])} |" in body
    # Evaluation tables from the report, the plots, and the short-context cost against the base.
    extended, report = _extended(tiny_run)
    base, patched = report["models"][:2]
    assert "| length | base | patched only | fine-tuned |" in body
    # The base evaluated beyond its 256-token context is marked †; the patched and fine-tuned models are not.
    at_1k = [m["perplexity"]["by_length"]["1024"] for m in (base, patched, extended)]
    assert f"| 1024 | {_cell(at_1k[0])} † | {_cell(at_1k[1])} | {_cell(at_1k[2])} |" in body
    pngs = sorted(p.name for p in (tiny_run / "eval").glob("*.png"))
    assert "ppl_by_position.png" in pngs
    for png in pngs:
        assert f"![{png[:-4]}](plots/{png})" in body
    b, e = base["perplexity"]["short_context"], extended["perplexity"]["short_context"]
    assert e["length"] == 256
    assert f"| fine-tuned | 256 | {_cell(e)} | {100 * (e['ppl'] / b['ppl'] - 1):+.2f} % |" in body
    assert "| 768–1024 |" in body  # position buckets
    # The fine-tuned model's passkey grid (each model has its own table: read the fine-tuned one).
    grid = body.split("Passkey accuracy, fine-tuned:", 1)[1].split("![", 1)[0]
    assert "| length \\ depth % | 0 | 100 | all [95 % CI] |" in grid
    cells = {c["depth"]: c["accuracy"] for c in extended["passkey"]["cells"] if c["length"] == 1024}
    mean = sum(cells.values()) / len(cells)
    assert f"| 1024 | {100 * cells[0]:.0f} (1) | {100 * cells[100]:.0f} (1) | {100 * mean:.0f} [" in grid
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
