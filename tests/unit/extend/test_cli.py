"""The core commands, run as a user runs them: ``ctxext inspect | extend | validate``."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.rope.read import read_rope
from ctxext.rope.runtime import verify_model_rope
from tests.helpers import ROOT

runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_every_command_has_help():
    for command in ["inspect", "extend", "validate", "methods"]:
        result = run(command, "--help")
        assert result.exit_code == 0, result.output
        assert "Usage" in result.output


def test_extend_writes_a_folder_vanilla_transformers_loads(tiny_model_dir, tmp_path):
    out = tmp_path / "ext"
    result = run("extend", str(tiny_model_dir), "--method", "yarn", "--target-length", "1024", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in out.iterdir()
    }
    model = AutoModelForCausalLM.from_pretrained(out).eval()  # plain transformers, no ctxext code involved
    assert model.config.rope_parameters["rope_type"] == "yarn"
    assert verify_model_rope(model).ok
    with torch.no_grad():
        assert torch.isfinite(model(torch.randint(0, 512, (1, 1024))).logits).all()
    # Weights are shared with the source (hard link) or copied, never changed.
    src = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.testing.assert_close(src.lm_head.weight, model.lm_head.weight)


def test_extend_legacy_fields(tiny_model_dir, tmp_path):
    out = tmp_path / "legacy"
    result = run(
        "extend",
        str(tiny_model_dir),
        "-m",
        "llama3",
        "-t",
        "2048",
        "-o",
        str(out),
        "--legacy-fields",
        "--high-freq-factor",
        "8",
    )
    assert result.exit_code == 0, result.output
    data = json.loads((out / "config.json").read_text())
    assert data["rope_scaling"]["type"] == "llama3" and data["rope_scaling"]["rope_type"] == "llama3"
    assert data["rope_scaling"]["high_freq_factor"] == 8.0
    assert data["rope_theta"] == 10000.0
    assert verify_model_rope(AutoModelForCausalLM.from_pretrained(out)).ok


def test_extend_failure_leaves_nothing(tiny_model_dir, tmp_path):
    out = tmp_path / "never"
    result = run("extend", str(tiny_model_dir), "-m", "yarn", "-t", "128", "-o", str(out))
    assert result.exit_code == 2
    assert "not above" in result.output
    assert not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".never")]
    result = run("extend", str(tiny_model_dir), "-m", "yarn", "-t", "1024", "-o", str(out), "--beta-fast", "0.5")
    assert result.exit_code == 2 and "beta_fast" in result.output
    assert not out.exists()


def test_extend_refuses_existing_out(tiny_model_dir, tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = run("extend", str(tiny_model_dir), "-m", "linear", "-t", "1024", "-o", str(out))
    assert result.exit_code == 2 and "already exists" in result.output
    assert (out / "notes.txt").read_text() == "mine"


def test_inspect_json_and_table(tiny_model_dir, tmp_path):
    out = tmp_path / "dyn"
    assert run("extend", str(tiny_model_dir), "-m", "dynamic", "-t", "1024", "-o", str(out)).exit_code == 0
    result = run("inspect", str(out), "--json", "--config-only")
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["rope_type"] == "dynamic"
    assert (info["original_context"], info["current_context"]) == (256, 1024)
    assert info["runtime_check"]["ok"] and len(info["runtime_check"]["checks"]) == 2
    table = run("inspect", str(tiny_model_dir))
    assert table.exit_code == 0 and "runtime RoPE" in table.output and "✓" in table.output


def test_inspect_reports_config_runtime_mismatch(tmp_path):
    # A checkpoint whose config was edited by hand into something transformers only warns about.
    from tests.helpers.tiny import tiny_model

    model = tiny_model()
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["rope_parameters"] = {
        "rope_type": "yarn",
        "factor": 4.0,
        "beta_fast": 1.0,
        "beta_slow": 2.0,
        "original_max_position_embeddings": 256,
        "rope_theta": 10000.0,
    }
    data["max_position_embeddings"] = 1024
    (tmp_path / "config.json").write_text(json.dumps(data))
    result = run("inspect", str(tmp_path), "--config-only")
    assert result.exit_code == 1
    assert "beta_fast" in result.output


def test_model_without_rope_gets_a_clear_error(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100)).save_pretrained(tmp_path / "gpt2")
    result = run("extend", str(tmp_path / "gpt2"), "-m", "yarn", "-t", "4096", "-o", str(tmp_path / "o"))
    assert result.exit_code == 2
    assert "no rotary position embedding" in result.output
    assert "Traceback" not in result.output


def test_offline_hub_id_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run("inspect", "nobody-has/this-model-xyz", "--config-only")
    assert result.exit_code == 2
    assert "HF_HUB_OFFLINE" in result.output


def test_validate_reports_several_errors_at_once(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "modle:\n  path: x\nrope:\n  method: yarn\n  target_length: 1024\n  beta_fastt: 2\n"
        "data:\n  path: y\ntrain:\n  max_steps: 0\n"
    )
    result = run("validate", str(bad))
    assert result.exit_code == 2
    for key in ("modle", "rope.beta_fastt", "train.max_steps", "model"):
        assert key in result.output


def test_validate_shipped_recipe_and_console_script():
    recipe = ROOT / "recipes" / "llama2-7b-yarn-32k.yaml"
    result = run("validate", str(recipe), "--set", "train.max_steps=10")
    assert result.exit_code == 0 and "10 steps" in result.output
    # The installed console script works as a separate process, with no traceback on bad input.
    proc = subprocess.run(
        [sys.executable, "-m", "ctxext", "validate", "/nonexistent.yaml"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_read_rope_of_extended_folder_records_target(tiny_model_dir, tmp_path):
    out = tmp_path / "y"
    assert run("extend", str(tiny_model_dir), "-m", "yarn", "-t", "2048", "-o", str(out)).exit_code == 0
    from transformers import AutoConfig

    state = read_rope(AutoConfig.from_pretrained(out))
    assert (state.original_length, state.current_length, state.factor) == (256, 2048, 8.0)
