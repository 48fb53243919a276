"""Full-parameter fine-tuning (``train.mode: full``): what the recipe resolves, and real runs on the CPU.

Trained in one process, in 2 DDP processes and in 2 FSDP2 processes (``accelerate launch``, gloo), a tiny model
gives the same losses and weights; the run folder is a complete model that loads, evaluates and exports as a plain
checkpoint; calibrated, its temperature applies where it loads, and ``ctxext merge`` and ``ctxext push`` publish it
as a model with the temperature folded in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.models.load import load_model
from ctxext.models.temperature import CALIBRATION_FILE, adapter_digest
from ctxext.publish.hub import STAGING_DIR
from ctxext.recipe.schema import load_recipe
from ctxext.training.run import read_run, train
from tests.helpers.hub import write_calibration
from tests.helpers.train import accelerate_cmd, run, write_full_recipe

runner = CliRunner()


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    ("given", "mode", "quantization"),
    [
        ({}, "qlora", "nf4"),  # existing recipes train as before
        ({"quantization": {"mode": "none"}}, "lora", "none"),  # an unquantized base without a mode: LoRA, as before
        ({"train": {"mode": "full"}}, "full", "none"),
        ({"train": {"mode": "lora"}}, "lora", "none"),
        ({"train": {"mode": "qlora"}, "quantization": {"mode": "int8"}}, "qlora", "int8"),
    ],
)
def test_the_schema_resolves_the_mode_and_the_base_storage_once(tmp_path, given, mode, quantization):
    data = {"model": {"path": "builtin:tiny-llama"}, "rope": {"method": "yarn", "target_length": 512}}
    data |= {"data": {"path": "builtin:stdlib"}, **given}
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    assert (recipe.train.mode, recipe.quantization.mode) == (mode, quantization)
    # The dumped recipe (a run's recipe.yaml, compared on --resume) reads back the same.
    from ctxext.recipe.schema import dump_recipe, parse_recipe

    again = parse_recipe(yaml.safe_load(dump_recipe(recipe)))
    assert (again.train.mode, again.quantization.mode) == (mode, quantization)


@pytest.mark.slow
def test_a_full_fine_tune_is_a_plain_checkpoint_that_evaluates_and_exports(tmp_path, cache_root):
    result = train(load_recipe(write_full_recipe(tmp_path, "run")))
    out = tmp_path / "run"
    info = read_run(out)
    assert info.mode == "full" and info.lora is None and info.quantization == "none"
    assert info.trainable_params == sum(p.numel() for p in result.model.parameters())
    assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
    # The one loader reads the run folder as a model folder: the trained weights, the patched RoPE, the same logits.
    loaded = load_model(str(out), device="cpu")
    assert loaded.adapter_dir is None and loaded.rope_check is not None and loaded.rope_check.ok
    assert loaded.context_length == 512
    ids = torch.randint(0, 200, (1, 300), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = result.model(ids).logits
        got = loaded.model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # Evaluated and exported as it is.
    ppl = runner.invoke(
        app,
        ["eval", "ppl", "--model", str(out), "--lengths", "128,256", "--max-docs", "4", "--data", "builtin:stdlib"]
        + ["--out", str(tmp_path / "ppl"), "--quiet"],
    )
    assert ppl.exit_code == 0, ppl.output
    assert json.loads((tmp_path / "ppl" / "report.json").read_text())
    exported = runner.invoke(app, ["export", str(out), "--for", "vllm"])
    assert exported.exit_code == 0 and f"vllm serve {out}" in exported.output, exported.output
    # Calibrated by the real command (measured on the run's whole weights), then a chosen temperature applies
    # wherever the run folder loads, and merge folds it into the published model.
    small = ["--trials", "2", "--window-trials", "1", "--depths", "0,100", "--windows", "4", "--temperatures", "1.3"]
    calibrate = runner.invoke(app, ["calibrate", str(out), "--data", "builtin:stdlib-train", *small])
    assert calibrate.exit_code == 0, calibrate.output
    assert json.loads((out / CALIBRATION_FILE).read_text())["adapter"] == adapter_digest(out)
    write_calibration(out, 1.3)  # the choice a significant gain would make (four trials cannot make one)
    hot = load_model(str(out), device="cpu")
    assert hot.attention_temperature == 1.3
    with torch.no_grad():
        calibrated_logits = hot.model(ids).logits
    assert not torch.allclose(calibrated_logits, want, atol=1e-3)
    merged = runner.invoke(app, ["merge", str(out), "--out", str(tmp_path / "merged"), "--smoke-length", "512"])
    assert merged.exit_code == 0, merged.output
    assert "folded into the query projections" in merged.output
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, calibrated_logits, rtol=1e-4, atol=1e-4)
    assert json.loads((tmp_path / "merged" / "ctxext_merge.json").read_text())["run"]["mode"] == "full"
    # Push publishes the whole model: the run is merged (into RUN/merged) first, as with --merged.
    push = runner.invoke(app, ["push", str(out), "--repo-id", "me/tiny-full", "--dry-run"])
    assert push.exit_code == 0, push.output
    assert "full fine-tune: publishing the whole model" in " ".join(push.output.split())
    assert (out / "merged" / "model.safetensors").is_file()
    text = (out / "merged" / STAGING_DIR / "README.md").read_text()
    assert "a full fine-tune (every weight trained)" in text and "full-fine-tune" in text and "LoRA rank" not in text


@pytest.mark.slow
def test_two_ddp_processes_train_as_one(tmp_path, cache_root):
    # One process with micro-batches of 2 rows, two with 1 row each: the same rows in every step.
    train(load_recipe(write_full_recipe(tmp_path, "one")))
    cmd = accelerate_cmd(2, "train", str(write_full_recipe(tmp_path, "two", train={"micro_batch_size": 1})))
    done = run(cmd, timeout=400, ACCELERATE_USE_CPU="true", CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = read_run(tmp_path / "one"), read_run(tmp_path / "two")
    assert two.mode == "full" and two.topology is not None
    assert (two.topology.world_size, two.topology.sharding) == (2, "ddp")
    assert two.tokens_seen == one.tokens_seen
    torch.testing.assert_close(losses(tmp_path / "two"), losses(tmp_path / "one"), rtol=1e-4, atol=0)
    assert two.final_val_loss == pytest.approx(one.final_val_loss, rel=1e-4)
    from safetensors.torch import load_file

    a, b = (load_file(str(tmp_path / name / "model.safetensors")) for name in ("one", "two"))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_an_fsdp_launch_on_the_cpu_is_refused_not_run_as_ddp(tmp_path, cache_root):
    # accelerate shards with FSDP (and DeepSpeed) on GPUs only; on the CPU it would quietly run DDP instead.
    cmd = accelerate_cmd(2, "train", str(write_full_recipe(tmp_path, "two", train={"micro_batch_size": 1})))
    at = cmd.index("--multi_gpu")
    cmd[at : at + 1] = ["--use_fsdp", "--fsdp_version", "2"]
    done = run(cmd, timeout=400, ACCELERATE_USE_CPU="true", CTXEXT_CACHE=str(cache_root))
    assert done.returncode != 0
    message = " ".join(done.stderr.split())
    assert "the launch asks for FSDP, but accelerate shards with FSDP on GPUs only" in message, done.stderr[-3000:]
    assert not (tmp_path / "two" / "run.json").exists()  # (the launcher's own traceback follows the children's exit)
