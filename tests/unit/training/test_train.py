"""`ctxext train` in one process: real nf4 QLoRA on the CPU, the run folder, reload, failures."""

from __future__ import annotations

import json

import pytest
import torch

from ctxext.errors import CtxextError, InputError
from ctxext.recipe.schema import load_recipe
from ctxext.training.run import TrainingDiverged, read_run, train
from tests.helpers.train import write_recipe


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache_root):
    """One short QLoRA run at 4x the tiny model's context (256 → 1024, YaRN)."""
    tmp = tmp_path_factory.mktemp("train")
    recipe_path = write_recipe(
        tmp / "r.yaml",
        tmp / "run",
        rope={"method": "yarn", "target_length": 1024},
        data={"max_documents": 24, "validation_fraction": 0.15},
        train={
            "seq_len": 1024,
            "micro_batch_size": 2,
            "max_steps": 10,
            "learning_rate": 3e-3,
            "eval_every": 10,
            "eval_batches": 2,
            "loss_chunk_size": 256,
            "tracker": "tensorboard",
        },
    )
    recipe = load_recipe(recipe_path)
    return train(recipe), recipe


def test_qlora_at_4x_context_lowers_heldout_loss(trained):
    result, recipe = trained
    run_info = read_run(result.run_dir)
    assert run_info.status == "complete"
    assert run_info.initial_val_loss is not None
    assert run_info.final_val_loss < run_info.initial_val_loss - 0.01, run_info
    assert run_info.target_length == 1024 and run_info.original_length == 256
    # The base really is 4-bit NormalFloat with double quantization.
    import bitsandbytes as bnb

    layer = result.model.get_base_model().model.layers[0].self_attn.q_proj.base_layer
    assert isinstance(layer, bnb.nn.Linear4bit)
    assert layer.weight.quant_state.quant_type == "nf4" and layer.weight.quant_state.nested


def test_run_folder_contract(trained):
    result, recipe = trained
    d = result.run_dir
    for name in (
        "adapter_config.json",
        "adapter_model.safetensors",
        "config.json",
        "tokenizer.json",
        "recipe.yaml",
        "versions.json",
        "metrics.jsonl",
        "run.json",
    ):
        assert (d / name).is_file(), name
    assert not list(d.glob(".*tmp*"))
    info = read_run(d)
    written = json.loads((d / "run.json").read_text())
    for key in (
        "base_model",
        "base_model_resolved",
        "method",
        "rope_parameters",
        "original_length",
        "target_length",
        "seq_len",
        "steps",
        "tokens_seen",
        "quantization",
        "lora",
        "extra_trainable",
        "final_train_loss",
        "final_val_loss",
    ):
        assert key in written, key
    assert info.base_model == "builtin:tiny-llama" and info.steps == 10
    assert info.tokens_seen == 10 * 2 * 1024
    config = json.loads((d / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_parameters"]["factor"] == 4.0
    assert config["ctxext"]["target_length"] == 1024 and config["max_position_embeddings"] == 1024
    assert "quantization_config" not in config
    metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 11))
    for m in metrics:
        assert {"loss", "lr", "tokens_per_sec", "peak_mem_mb"} <= set(m)
    assert "val_loss" in metrics[-1] and metrics[-1]["val_loss"] == info.final_val_loss
    # The tensorboard tracker wrote its event file.
    assert list((d / "logs").rglob("events.out.tfevents.*"))
    versions = json.loads((d / "versions.json").read_text())
    assert versions["seed"] == 42 and versions["libraries"]["peft"]
    assert load_recipe(d / "recipe.yaml").model_dump() == recipe.model_dump()


def test_extra_modules_saved_and_reload_reproduces_logits(trained):
    from safetensors.torch import load_file

    from ctxext.models.load import load_for_inference
    from ctxext.rope.runtime import check_model_rope

    result, _ = trained
    saved = load_file(str(result.run_dir / "adapter_model.safetensors"))
    names = list(saved)
    assert any("embed_tokens" in n for n in names)
    assert any("input_layernorm" in n for n in names) and any(n.endswith("model.norm.weight") for n in names)
    assert any("lora_A" in n for n in names)

    reloaded, tokenizer = load_for_inference(None, result.run_dir)
    assert check_model_rope(reloaded.get_base_model()).ok
    base = reloaded.get_base_model()
    emb = base.model.embed_tokens
    # The trained embedding copy is active and differs from the frozen original.
    assert not torch.equal(emb.modules_to_save["default"].weight, emb.original_module.weight)
    ids = torch.randint(0, 500, (1, 1024), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = result.model(input_ids=ids).logits
        got = reloaded(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert tokenizer.eos_token_id is not None


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, cache_root):
    # A base checkpoint with one corrupt (infinite) embedding row: the loss turns NaN at the first
    # step whose batch holds that token. The data order is deterministic, so pick a token that first
    # appears at step 3: steps 1 and 2 are good and checkpointed.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ctxext.models.sources import resolve_model_path
    from ctxext.training.data.corpus import prepare_data
    from ctxext.training.run import micro_batches

    source = resolve_model_path("builtin:tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(source)
    recipe_path = write_recipe(
        tmp_path / "r.yaml",
        tmp_path / "run",
        model={"path": str(tmp_path / "corrupt")},
        train={"max_steps": 6, "save_every": 1, "micro_batch_size": 1},
        data={"max_documents": 6, "validation_fraction": 0},
    )
    recipe = load_recipe(recipe_path)
    data = prepare_data(recipe.data, tokenizer, recipe.seq_len, seed=recipe.train.seed)
    order = micro_batches(len(data.train), 1, 1, 0, recipe.train.seed)
    seen = [set(data.train[next(order)]["input_ids"].flatten().tolist()) for _ in range(3)]
    token = min(seen[2] - seen[0] - seen[1])
    model = AutoModelForCausalLM.from_pretrained(source)
    with torch.no_grad():
        model.model.embed_tokens.weight[token] = float("inf")
    model.save_pretrained(tmp_path / "corrupt")
    tokenizer.save_pretrained(tmp_path / "corrupt")

    with pytest.raises(
        TrainingDiverged, match=r"the loss became nan at step 3.*last good checkpoint is .*step-0000002"
    ):
        train(recipe)
    info = read_run(tmp_path / "run", allow_incomplete=True)
    assert info.status == "failed"
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step-*")) == ["step-0000001", "step-0000002"]
    with pytest.raises(InputError, match="incomplete run"):
        read_run(tmp_path / "run")


def test_read_run_errors(tmp_path):
    with pytest.raises(InputError, match="not a ctxext run folder"):
        read_run(tmp_path)


def test_cli_bad_recipe_and_folders(tmp_path, cache_root):
    # In-process (the command line parsing and the error handling are the same as in a subprocess).
    from typer.testing import CliRunner

    from ctxext.cli.commands import app

    def bad(*args: str) -> str:
        result = CliRunner().invoke(app, ["train", *args])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
        return " ".join(result.output.split())

    recipe = str(write_recipe(tmp_path / "r.yaml", tmp_path / "run"))
    assert "train.max_stepz" in bad(recipe, "train.max_stepz=3")
    assert "no run to resume" in bad(recipe, "--resume")
    message = bad(recipe, "lora.target_modules=[qkv_proj]", "train.max_steps=1")
    assert "qkv_proj" in message and "q_proj" in message
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "something").write_text("x")
    assert "already exists" in bad(recipe)


def test_training_errors_are_ctxext_errors():
    assert issubclass(TrainingDiverged, CtxextError)


def test_shipped_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    from tests.helpers.train import ROOT

    kinds = {}
    for path in sorted((ROOT / "configs" / "accelerate").glob("*.yaml")):
        kinds[path.stem] = load_config_from_file(str(path))
    assert set(kinds) == {"single_gpu", "multi_gpu_ddp", "fsdp2", "deepspeed_zero3"}
    assert kinds["fsdp2"].fsdp_config["fsdp_version"] == 2
    ds_file = ROOT / kinds["deepspeed_zero3"].deepspeed_config["deepspeed_config_file"]
    assert json.loads(ds_file.read_text())["zero_optimization"]["stage"] == 3


def test_tiny_cpu_recipe_is_above_the_model_context():
    from ctxext.models.sources import load_config
    from tests.helpers.train import ROOT

    recipe = load_recipe(ROOT / "recipes" / "tiny-cpu.yaml", ["output.dir=/tmp/x"])
    config, _ = load_config(recipe.model.path)
    assert recipe.seq_len > config.max_position_embeddings
    assert recipe.quantization.mode == "nf4" and recipe.data.path == "builtin:stdlib"
    assert "ctxext train recipes/tiny-cpu.yaml" in (ROOT / "recipes" / "tiny-cpu.yaml").read_text()
