"""Tied embeddings through training, the calibrate fold, merge, export and push: one matrix, or untied and said.

The base is a tiny Llama shaped like SmolLM2 (9 query / 3 key-value heads, ``tie_word_embeddings: true``), trained
with the shared run recipe (embeddings and norms trained in full beside LoRA).
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from ctxext.cli.commands import app
from tests.helpers.evaluation import GQA, save_tiny_model
from tests.helpers.hub import build_tiny_run, copy_run, write_calibration

runner = CliRunner()
EMBED = "base_model.model.model.embed_tokens.weight"


@pytest.fixture(scope="module")
def tied_base(tmp_path_factory, tiny_tokenizer) -> Path:
    return save_tiny_model(tiny_tokenizer, tmp_path_factory.mktemp("tied-base"), tie_word_embeddings=True, **GQA)


@pytest.fixture(scope="module")
def tied_run(tmp_path_factory, tied_base):
    """``(run folder, the warnings training raised)``."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = build_tiny_run(tied_base, tmp_path_factory.mktemp("tied") / "run", steps=2)
    return run, caught


def _keys(path: Path) -> set[str]:
    with safe_open(str(path), "pt") as handle:
        return set(handle.keys())


def _logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_training_a_tied_base_trains_the_shared_matrix_without_a_peft_warning(tied_run, tied_base):
    run, caught = tied_run
    about_ties = [str(w.message) for w in caught if "tying" in str(w.message) or "tie_word" in str(w.message)]
    assert about_ties == []
    assert json.loads((run / "adapter_config.json").read_text())["ensure_weight_tying"] is True
    trained = load_file(run / "adapter_model.safetensors")[EMBED]
    assert not torch.equal(trained, load_file(tied_base / "model.safetensors")["model.embed_tokens.weight"])


def test_merge_keeps_one_tensor_and_the_adapter_models_logits(tied_run, tied_base, tmp_path):
    from ctxext.models.load import ModelSpec, load_model
    from ctxext.publish.card import build_model_card
    from ctxext.publish.merge import merge_run

    run, _ = tied_run
    out = tmp_path / "merged"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = merge_run(run, out, log=lambda line: None)
    assert [str(w.message) for w in caught if "tying" in str(w.message) or "tied" in str(w.message)] == []
    assert result.ok and result.embeddings == "tied" and result.max_abs_diff <= 1e-4
    assert "lm_head.weight" not in _keys(out / "model.safetensors")  # stored once
    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert merged.config.tie_word_embeddings is True
    assert merged.lm_head.weight is merged.model.embed_tokens.weight
    assert torch.equal(merged.model.embed_tokens.weight.detach(), load_file(run / "adapter_model.safetensors")[EMBED])
    adapter = load_model(ModelSpec(str(run)), device="cpu")  # the fp32 base + the run's adapter
    ids = torch.randint(3, 500, (1, 300), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(merged, ids), _logits(adapter.model, ids), rtol=0, atol=1e-4)
    assert "tied (one matrix)" in build_model_card(out)


# The test builds such an adapter on purpose; peft warns about it while building.
@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_an_adapter_that_trained_a_separate_copy_is_merged_untied_and_the_card_says_so(tied_run, tied_base, tmp_path):
    """Runs made before ctxext kept ties: the input copy trained alone, lm_head left at the base's values."""
    from peft import LoraConfig, get_peft_model

    from ctxext.publish.card import build_model_card
    from ctxext.publish.merge import merge_run

    run = copy_run(tied_run[0], tmp_path / "legacy")
    base = AutoModelForCausalLM.from_pretrained(tied_base)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["embed_tokens"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft's warning about exactly this
        legacy = get_peft_model(base, config)
    with torch.no_grad():
        legacy.base_model.model.model.embed_tokens.modules_to_save["default"].weight.add_(0.01)
    saved = tmp_path / "adapter"
    legacy.save_pretrained(saved)
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        shutil.copy2(saved / name, run / name)
    lines: list[str] = []
    # peft's own warnings (the CLI silences them: ctxext says it in its words, on the console and in the card).
    with pytest.warns(UserWarning, match="no longer tied after merging"):
        result = merge_run(run, tmp_path / "merged", log=lines.append)
    assert result.ok and result.embeddings == "untied" and result.max_abs_diff <= 1e-4
    assert any("untied lm_head" in line for line in lines)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert merged.config.tie_word_embeddings is False
    original = load_file(tied_base / "model.safetensors")["model.embed_tokens.weight"]
    torch.testing.assert_close(merged.lm_head.weight.detach(), original)
    torch.testing.assert_close(merged.model.embed_tokens.weight.detach(), original + 0.01)
    assert "**Untied embeddings.**" in build_model_card(tmp_path / "merged")


def test_the_calibrate_fold_export_and_push_keep_the_tie(tied_run, tmp_path):
    from ctxext.publish.export import export_for

    run = write_calibration(copy_run(tied_run[0], tmp_path / "calibrated"), 1.25)
    folder, text = export_for(run, ["vllm", "lm-eval"], tmp_path / "exported", log=lambda line: None)
    assert "vllm serve" in text and (folder / "COMMANDS.md").is_file()
    smoke = json.loads((folder / "ctxext_merge.json").read_text())["smoke"]
    assert smoke["ok"] and smoke["embeddings"] == "tied" and smoke["attention_temperature"] == 1.25
    assert "lm_head.weight" not in _keys(folder / "model.safetensors")
    pushed = runner.invoke(app, ["push", str(folder), "--repo-id", "me/tied", "--dry-run"])
    assert pushed.exit_code == 0, pushed.output
    staged = AutoModelForCausalLM.from_pretrained(folder / "hub")
    assert staged.lm_head.weight is staged.model.embed_tokens.weight
