"""Nothing silently wrong: what is written is verified from disk against the plan, extension composes on
purpose, and configs whose stated intent and runtime disagree are flagged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.rope.plan import apply_plan, plan_extension
from ctxext.rope.read import read_rope
from ctxext.rope.runtime import intent_problems, runtime_model_from_config
from ctxext.rope.types import RopeError, RopeMismatchError
from ctxext.rope.verify import verify_folder
from tests.helpers.tiny import tiny_config, tiny_model

runner = CliRunner()
D = 16  # the tiny models' head dim


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def flat(result) -> str:
    return " ".join(result.output.split())


def phi_folder(path: Path, prf: float = 0.4) -> Path:
    from transformers import PhiConfig

    config = PhiConfig(
        vocab_size=128,
        hidden_size=80,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=256,
        partial_rotary_factor=prf,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


# --- verified on what the user loads ----------------------------------------------------------


def test_legacy_fields_keep_partial_rotary_factor(tmp_path):
    src = phi_folder(tmp_path / "phi")
    out = tmp_path / "out"
    result = run("extend", src, "-m", "yarn", "-t", "1024", "-o", out, "--legacy-fields")
    assert result.exit_code == 0, result.output
    assert "cos/sin at positions [0, 255, 1023]" in flat(result)
    data = json.loads((out / "config.json").read_text())
    assert data["rope_scaling"]["partial_rotary_factor"] == 0.4 and data["partial_rotary_factor"] == 0.4
    reloaded = AutoModelForCausalLM.from_pretrained(out)  # plain transformers
    assert reloaded.model.rotary_emb.inv_freq.numel() == 4  # 0.4 × 20 = 8 rotary dims, not 0.5 × 20 = 10
    assert read_rope(reloaded.config).rotary_dim == 8


def test_verify_folder_catches_a_dropped_rope_key_and_a_wrong_factor(tmp_path):
    src = phi_folder(tmp_path / "phi")
    config = AutoConfig.from_pretrained(src)
    plan = plan_extension(config, "yarn", 1024)
    apply_plan(config, plan)
    config.save_pretrained(tmp_path / "w")
    (tmp_path / "w" / "model.safetensors").hardlink_to(src / "model.safetensors")
    assert "matches the plan" in verify_folder(tmp_path / "w", plan)
    # What --legacy-fields used to write: a rope_scaling without partial_rotary_factor.
    data = json.loads((tmp_path / "w" / "config.json").read_text())
    data["rope_scaling"] = {k: v for k, v in data["rope_parameters"].items() if k != "partial_rotary_factor"}
    (tmp_path / "w" / "config.json").write_text(json.dumps(data))
    with pytest.raises(RopeMismatchError, match="rotates 10 dimensions per head, the plan 8"):
        verify_folder(tmp_path / "w", plan)
    data.pop("rope_scaling")
    data["rope_parameters"]["factor"] = 2.0
    (tmp_path / "w" / "config.json").write_text(json.dumps(data))
    with pytest.raises(RopeMismatchError, match="differ from the plan"):
        verify_folder(tmp_path / "w", plan)


def test_truncated_weights_fail_before_verified(tiny_model_dir, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for f in tiny_model_dir.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    blob = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(blob[: len(blob) // 2])
    out = tmp_path / "out"
    result = run("extend", src, "-m", "yarn", "-t", "1024", "-o", out)
    assert result.exit_code == 2, result.output
    assert "truncated or corrupt" in flat(result) and "✓" not in result.output
    assert not out.exists() and "Traceback" not in result.output


# --- composing on purpose ---------------------------------------------------------------------


def test_ntk_alpha_must_lengthen_wavelengths(tiny_model_dir, tmp_path):
    for alpha in ("0.5", "1"):
        result = run("extend", tiny_model_dir, "-m", "ntk", "-t", "1024", "--alpha", alpha, "-o", tmp_path / alpha)
        assert result.exit_code == 2 and "must be a number > 1" in flat(result), result.output
        assert not (tmp_path / alpha).exists()


def test_reextending_an_ntk_model_composes_only_on_purpose(tiny_model_dir, tmp_path):
    first = tmp_path / "ntk1k"
    assert run("extend", tiny_model_dir, "-m", "ntk", "-t", "1024", "-o", first).exit_code == 0
    theta1 = 1e4 * 4 ** (D / (D - 2))
    assert read_rope(AutoConfig.from_pretrained(first)).rope_theta == pytest.approx(theta1)
    refused = run("extend", first, "-m", "ntk", "-t", "2048", "-o", tmp_path / "x")
    assert (
        refused.exit_code == 2
        and "ctxext extend --relative-to original|current" in flat(refused)
        and "extended by ctxext" in flat(refused)
    )
    # Relative to the original: restart from the base theta (the raised one is not scaled again).
    assert (
        run("extend", first, "-m", "ntk", "-t", "2048", "-o", tmp_path / "o", "--relative-to", "original").exit_code
        == 0
    )
    state = read_rope(AutoConfig.from_pretrained(tmp_path / "o"))
    assert state.rope_theta == pytest.approx(1e4 * 8 ** (D / (D - 2)))
    assert (state.original_length, state.current_length) == (256, 2048)
    # Relative to the current state: the raised theta is the new base, scaled by 2048/1024.
    assert (
        run("extend", first, "-m", "ntk", "-t", "2048", "-o", tmp_path / "c", "--relative-to", "current").exit_code == 0
    )
    state = read_rope(AutoConfig.from_pretrained(tmp_path / "c"))
    assert state.rope_theta == pytest.approx(theta1 * 2 ** (D / (D - 2)))
    assert (state.original_length, state.current_length) == (1024, 2048)
    # A theta-extended model then YaRN: relative to original, YaRN runs on the base theta.
    theta = tmp_path / "theta"
    assert run("extend", tiny_model_dir, "-m", "theta", "-t", "1024", "--rope-theta", "1e6", "-o", theta).exit_code == 0
    yarn = tmp_path / "yarn"
    assert run("extend", theta, "-m", "yarn", "-t", "2048", "-o", yarn, "--relative-to", "original").exit_code == 0
    params = AutoConfig.from_pretrained(yarn).rope_parameters
    assert params["rope_theta"] == 1e4 and params["factor"] == 8.0


def test_linear_on_linear_relative_to_current_is_one_linear_scaling():
    config = tiny_config(max_position_embeddings=512, rope_scaling={"rope_type": "linear", "factor": 2.0})
    plan = plan_extension(config, "linear", 1024, relative_to="current")
    assert plan.rope_parameters["factor"] == 4.0 and plan.original_length == 256


# --- reading configs as their authors meant them ----------------------------------------------


def test_read_rope_qwen25_style_yarn():
    # Qwen2.5's documented recipe: keep max_position_embeddings = original = 32768, add yarn factor 4.
    config = tiny_config(
        "qwen2",
        max_position_embeddings=32768,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )
    state = read_rope(config)
    assert (state.original_length, state.current_length) == (32768, 131072)
    assert any("factor" in n for n in state.notes)
    assert intent_problems(state) == {}


def test_read_rope_vicuna_16k_style_linear():
    # lmsys/vicuna-13b-v1.5-16k: max_position_embeddings 4096 (the original), linear factor 4 → 16384.
    state = read_rope(tiny_config(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 4.0}))
    assert (state.original_length, state.current_length) == (4096, 16384)
    # LongChat-7b-16k writes the target instead: 16384, factor 8 → pretrained at 2048.
    state = read_rope(tiny_config(max_position_embeddings=16384, rope_scaling={"type": "linear", "factor": 8.0}))
    assert (state.original_length, state.current_length) == (2048, 16384)
    assert state.notes and "--original-length" in state.notes[0]
    state = read_rope(
        tiny_config(max_position_embeddings=4096, rope_scaling={"type": "linear", "factor": 4.0}), original_length=1024
    )
    assert (state.original_length, state.current_length) == (1024, 4096)


# --- intent vs runtime in inspect -------------------------------------------------------------


def test_inspect_flags_the_dynamic_trap_and_a_yarn_factor_mismatch(tiny_model_dir, tmp_path):
    dyn = tmp_path / "dyn"
    assert run("extend", tiny_model_dir, "-m", "dynamic", "-t", "1024", "-o", dyn).exit_code == 0
    assert run("inspect", dyn, "--config-only").exit_code == 0
    data = json.loads((dyn / "config.json").read_text())
    data["max_position_embeddings"] = 1024  # the trap: positions up to 1024 would run unscaled
    (dyn / "config.json").write_text(json.dumps(data))
    result = run("inspect", dyn, "--config-only", "--json")
    assert result.exit_code == 1
    assert "run unscaled" in json.loads(result.output)["config_problems"]["max_position_embeddings"]

    yarn = tmp_path / "yarn"
    model = tiny_model()
    model.config.max_position_embeddings = 2048
    model.config.rope_parameters = {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 256,
        "rope_theta": 1e4,
    }
    model.save_pretrained(yarn)
    result = run("inspect", yarn, "--config-only", "--json")
    assert result.exit_code == 1
    assert "max_position_embeddings says 2048" in json.loads(result.output)["config_problems"]["rope_parameters.factor"]


def test_inspect_original_length_finds_the_dynamic_trap_in_a_third_party_config(tmp_path):
    """A dynamic config not written by ctxext: only --original-length says where pretraining ended."""
    dyn = tmp_path / "third-party-dynamic"
    model = tiny_model()
    model.config.max_position_embeddings = 1024
    model.config.rope_parameters = {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}
    model.save_pretrained(dyn)
    assert run("inspect", dyn, "--config-only").exit_code == 0  # nothing says 1024 is not the original length
    result = run("inspect", dyn, "--config-only", "--json", "--original-length", "64")
    assert result.exit_code == 1, result.output
    info = json.loads(result.output)
    assert info["original_context"] == 64
    problem = info["config_problems"]["max_position_embeddings"]
    assert "original context is 64" in problem and "positions 64–1024 run unscaled" in problem
    assert "Set max_position_embeddings to 64" in problem
    # The table view says the same and fails the same way.
    result = run("inspect", dyn, "--config-only", "--original-length", "64")
    assert result.exit_code == 1 and "run unscaled" in flat(result)
    # Stated at the config's own window, there is no trap.
    assert run("inspect", dyn, "--config-only", "--original-length", "1024").exit_code == 0


def test_cos_sin_not_from_inv_freq_is_caught():
    config = tiny_config()
    model = runtime_model_from_config(config)
    state = read_rope(config)
    assert intent_problems(state, model) == {}
    rotary = model.model.rotary_emb
    original_forward = rotary.forward

    def skewed(x, position_ids):  # a custom module: correct inv_freq, but positions doubled in cos/sin
        return original_forward(x, position_ids * 2)

    rotary.forward = skewed
    problems = intent_problems(state, model)
    assert "runtime cos/sin" in problems and "position 255" in problems["runtime cos/sin"]


def test_methods_state_the_dynamic_definition():
    result = run("methods")
    assert result.exit_code == 0 and "α = T/L" in flat(result)


def test_patched_runtime_matches_plan_for_every_method(tmp_path):
    # Every method's plan, applied to a config and built as transformers builds it, passes the plan check.
    from ctxext.rope.methods import METHODS
    from ctxext.rope.runtime import verify_against_plan

    options = {"theta": {"rope_theta": 1e6}, "longrope": {"short_factor": [1.0] * 8, "long_factor": [4.0] * 8}}
    for method in METHODS:
        config = tiny_config()
        plan = plan_extension(config, method, 1024, options.get(method))
        apply_plan(config, plan)
        assert "matches the plan" in verify_against_plan(runtime_model_from_config(config), plan), method
    with pytest.raises(RopeError):
        plan_extension(tiny_config(), "ntk", 1024, {"alpha": 1.0})
