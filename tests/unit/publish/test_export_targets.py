"""``ctxext export RUN --for vllm|lm-eval|helmet``: the merged folder each stack loads builds ctxext's planned RoPE.

lm-eval (``HFLM(pretrained=DIR)``) and HELMET (``AutoConfig`` + ``AutoModelForCausalLM`` as its ``model_utils/hf.py``
does) are loaded here for real and their rotary modules checked against the run's plan; vLLM cannot be installed
here, so its reading of ``config.json`` (from vLLM's source: ``get_rope``'s required keys, ``--max-model-len``'s
limit) is checked as ctxext mirrors it.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ctxext.cli.commands import app
from tests.helpers.hub import TARGET, shared_run

runner = CliRunner()


@pytest.fixture(scope="module")
def exported(tmp_path_factory, tiny_model_dir) -> tuple[Path, Path, str]:
    run_dir = shared_run(tmp_path_factory, tiny_model_dir)
    out = tmp_path_factory.mktemp("export") / "served"
    args = ["export", str(run_dir), "--for", "vllm", "--for", "lm-eval", "--for", "helmet", "--out", str(out)]
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return run_dir, out, (out / "COMMANDS.md").read_text()


def _plan(run_dir: Path):
    from ctxext.artifacts.run import RunRecord, plan_from_run
    from ctxext.models.sources import config_from_folder

    return plan_from_run(RunRecord.read(run_dir), config_from_folder(run_dir))


def test_lm_eval_loads_the_folder_with_the_planned_rope(exported):
    from lm_eval.models.huggingface import HFLM

    from ctxext.rope.runtime import verify_against_plan

    run_dir, out, commands = exported
    assert f"pretrained={out},max_length={TARGET}" in commands
    lm = HFLM(pretrained=str(out), max_length=TARGET, batch_size=1, device="cpu", dtype="float32")
    assert "matches the plan" in verify_against_plan(lm.model, _plan(run_dir))


def test_helmet_loads_the_folder_with_the_planned_rope(exported):
    from transformers import AutoConfig, AutoModelForCausalLM

    from ctxext.rope.runtime import verify_against_plan

    run_dir, out, commands = exported
    helmet = next(line for line in commands.splitlines() if line.startswith("python eval.py"))
    flags = shlex.split(helmet)
    assert flags[flags.index("--input_max_length") + 1] == str(TARGET)
    assert "--rope_theta" not in flags and "--rope_scaling" not in flags
    config = AutoConfig.from_pretrained(out, trust_remote_code=True)  # HELMET's HFModel, without its overrides
    model = AutoModelForCausalLM.from_pretrained(out, config=config)
    assert "matches the plan" in verify_against_plan(model, _plan(run_dir))


def test_vllm_reads_the_scaling_and_accepts_the_target_length(exported):
    from ctxext.publish.export import VLLM_REQUIRED_KEYS, serving_facts, serving_problems, vllm_max_len

    run_dir, out, commands = exported
    facts = serving_facts(out)
    written = json.loads((out / "config.json").read_text())["rope_parameters"]
    assert facts.rope_type == "yarn" and written == json.loads((run_dir / "config.json").read_text())["rope_parameters"]
    assert all(k in written for k in VLLM_REQUIRED_KEYS["yarn"]) and "rope_theta" in written
    assert vllm_max_len(facts) >= TARGET and serving_problems(facts, "vllm") == []
    serve = shlex.split(next(line for line in commands.splitlines() if line.startswith("vllm serve")))
    assert serve[serve.index("--max-model-len") + 1] == str(TARGET)
    overrides = json.loads(serve[serve.index("--hf-overrides") + 1])
    assert overrides["rope_parameters"] == written


def test_vllm_problems_are_named(tmp_path):
    """A tokenizer capping the length, or a yarn config without its original length, is reported."""
    from ctxext.publish.export import ServingFacts, serving_problems

    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "rope_theta": 1e4}
    capped = ServingFacts(tmp_path, params, 1024, 1024, 256, tokenizer_max_length=512)
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" not in " ".join(serving_problems(capped, "vllm"))  # yarn ignores it
    linear = ServingFacts(tmp_path, {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}, 1024, 1024, 256, 200)
    assert "VLLM_ALLOW_LONG_MAX_MODEL_LEN" in " ".join(serving_problems(linear, "vllm"))
    bare = ServingFacts(tmp_path, {"rope_type": "yarn", "factor": 4.0}, 1024, 1024, 256)
    text = " ".join(serving_problems(bare, "vllm"))
    assert "original_max_position_embeddings" in text and "rope_theta" in text


def test_export_of_a_run_needs_out_and_a_known_target(tmp_path_factory, tiny_model_dir, tmp_path):
    run_dir = shared_run(tmp_path_factory, tiny_model_dir)
    result = runner.invoke(app, ["export", str(run_dir), "--for", "vllm"])
    assert result.exit_code == 2 and "--out" in result.output
    result = runner.invoke(app, ["export", str(run_dir), "--for", "tgi", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "tgi" in result.output and "vllm" in result.output
    assert not (tmp_path / "x").exists()
