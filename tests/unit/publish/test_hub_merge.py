"""``ctxext merge``: a tiny QLoRA run folded into its full-precision base, checked, loadable by plain transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.rope.runtime import verify_model_rope
from tests.helpers.hub import HUB_ID, LORA, copy_run, shared_merge, shared_run

runner = CliRunner()
PREFIX = "base_model.model."


def flat(result) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(result.output.split())


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_model_dir) -> Path:
    return shared_run(tmp_path_factory, tiny_model_dir)


@pytest.fixture(scope="session")
def merged(tmp_path_factory, tiny_model_dir):
    return shared_merge(tmp_path_factory, tiny_model_dir)


def test_the_run_is_what_ctxext_train_writes_from_a_hub_base(tiny_run):
    """The shared run names its base by Hub id, resolved offline from the HF cache, with the weights' fingerprint."""
    from ctxext.models.weights import fingerprint

    run = json.loads((tiny_run / "run.json").read_text())
    assert run["status"] == "complete" and run["base_model"] == HUB_ID
    resolved = Path(run["base_model_resolved"])
    assert resolved.parent.parent.name == "models--me--tiny-llama" and resolved.parent.name == "snapshots"
    assert run["base_fingerprint"] == fingerprint(resolved)
    assert (run["method"], run["original_length"], run["target_length"], run["quantization"]) == (
        "yarn",
        256,
        1024,
        "nf4",
    )


def test_smoke_test_passes_at_the_target_length(merged):
    _, result = merged
    assert result.ok
    assert result.length == 1024 and result.sequences == 2 and result.positions == 256
    assert result.dtype == "float32"
    # float32 merging only reorders additions: measured ~3e-7 on this model, stated tolerance 1e-3.
    assert result.max_abs_diff <= 1e-4 < result.tolerance
    assert result.argmax_agreement == 1.0
    assert result.ppl == pytest.approx(result.reference_ppl, rel=1e-4)
    assert result.passkey_key.isdigit() and len(result.passkey_key) == 5


def test_merged_folder_loads_in_plain_transformers_with_the_rope(merged, tiny_run):
    out, _ = merged
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    run_config = json.loads((tiny_run / "config.json").read_text())
    assert model.config.rope_parameters == run_config["rope_parameters"]
    assert model.config.max_position_embeddings == 1024
    assert model.config.ctxext["target_length"] == 1024
    assert getattr(model.config, "quantization_config", None) is None
    assert verify_model_rope(model).ok
    assert {"tokenizer.json", "model.safetensors", "ctxext_merge.json", "recipe.yaml"} <= {
        p.name for p in out.iterdir()
    }
    assert (out / "eval" / "report.json").is_file() and (out / "eval" / "ppl_by_position.png").is_file()
    assert not (out / "adapter_config.json").exists()


def test_merged_weights_are_base_plus_lora_and_the_trained_modules(merged, tiny_run, tiny_model_dir):
    """Checked from the files, independently of peft: W' = W + (alpha/r)·B·A, embeddings/norms = trained copies."""
    out, _ = merged
    base = load_file(tiny_model_dir / "model.safetensors")
    adapter = load_file(tiny_run / "adapter_model.safetensors")
    got = load_file(out / "model.safetensors")
    scale = LORA["alpha"] / LORA["r"]
    for layer in range(2):
        for module in ("self_attn.q_proj", "mlp.down_proj"):
            key = f"model.layers.{layer}.{module}"
            a = adapter[f"{PREFIX}{key}.lora_A.weight"]
            b = adapter[f"{PREFIX}{key}.lora_B.weight"]
            assert b.abs().max() > 0, "training must have moved LoRA B away from its zero init"
            expected = base[f"{key}.weight"] + scale * (b @ a)
            torch.testing.assert_close(got[f"{key}.weight"], expected, atol=1e-6, rtol=1e-5)
            assert not torch.equal(got[f"{key}.weight"], base[f"{key}.weight"])
    for key in ("model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight"):
        trained = adapter[f"{PREFIX}{key}"]
        assert not torch.equal(trained, base[key]), f"{key} was not trained"
        assert torch.equal(got[key], trained)
    torch.testing.assert_close(got["lm_head.weight"], base["lm_head.weight"])


def test_failed_check_leaves_nothing_and_exits_nonzero(tiny_run, tmp_path):
    out = tmp_path / "merged"
    result = runner.invoke(app, ["merge", str(tiny_run), "--out", str(out), "--tolerance", "0"])
    assert result.exit_code == 1, result.output
    assert "merge check failed" in flat(result) and "Traceback" not in result.output
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary folder left behind either


def test_incomplete_run_is_refused(tiny_run, tmp_path):
    run = copy_run(tiny_run, tmp_path / "run", status="running")
    result = runner.invoke(app, ["merge", str(run), "--out", str(tmp_path / "m")])
    assert result.exit_code == 2
    assert "not complete" in flat(result) and "--force" in flat(result)
    assert not (tmp_path / "m").exists()


def test_existing_output_is_not_overwritten(tiny_run, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = runner.invoke(app, ["merge", str(tiny_run), "--out", str(out)])
    assert result.exit_code == 2 and "already exists" in flat(result)
    assert (out / "keep.txt").read_text() == "mine"
