"""`ctxext validate` refuses exactly what `ctxext train` refuses before it loads a model, with the same key and
message: both run :func:`ctxext.recipe.refusals.refusals`. One recipe per refusal, each run through `validate`, the
library's `train()` and the `train` command; and the module stays importable without torch."""

from __future__ import annotations

import ast
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.recipe.refusals import Machine, refusals
from ctxext.recipe.schema import RecipeError, load_recipe
from ctxext.training.run import train
from tests.helpers import ROOT

runner = CliRunner()
NEOX = ROOT / "ctxext" / "resources" / "grown-neox-64"
NEOX_LORA = {"target_modules": ["query_key_value", "dense"], "extra_trainable": ["embed_in", "norm"]}

# Each: recipe changes, the key named, words of the message. Before the refusals were one module, validate accepted
# each of these and train refused it only once the model (or the data) was loaded, or at its launch.
CASES = {
    "LoRA module the model lacks": ({"lora": {"target_modules": ["q_proj", "qkv_proj"]}}, "lora.target_modules",
                                    "qkv_proj match no module of this model"),
    "LoRA trained module the model lacks": ({"lora": {"extra_trainable": ["embed_in"]}}, "lora.extra_trainable",
                                            "embed_in match no module name suffix"),
    "builtin data read in another field": ({"data": {"path": "builtin:stdlib", "text_field": "content"}},
                                           "data.text_field", "has only the field 'text'"),
    "unknown builtin split": ({"data": {"path": "builtin:stdlib-nope"}}, "data.path", "nope"),
    "data that does not exist": ({"data": {"path": "{tmp}/missing.jsonl"}}, "data.path",
                                 "missing.jsonl does not exist"),
    "data that is not UTF-8": ({"data": {"path": "{tmp}/latin1.txt"}}, "data.path", "not UTF-8"),
    "a model that does not exist": ({"model": {"path": "{tmp}/no-model"}}, "model.path", "no-model does not exist"),
    "an extension the model cannot take": ({"rope": {"method": "yarn", "target_length": 128}}, "rope", "128"),
    "short blocks without a rope method": ({"rope": {"method": "none"}, "train": {"seq_len": 256},
                                            "data": {"path": "builtin:stdlib", "short_fraction": 0.2}},
                                           "data.short_fraction", "needs the model's original length"),
    "unpacked examples shorter than a row": ({"data": {"path": "builtin:stdlib", "packing": False, "min_tokens": 64}},
                                             "data.min_tokens", "64 is below train.seq_len (512)"),
    "a head split wider than the heads": ({"train": {"sequence_parallel_size": 8}}, "train.sequence_parallel_size",
                                          "8 exceeds the model's 4 attention heads"),
    "a tiled MLP on a model whose MLP is not gated": (
        {"model": {"path": str(NEOX)}, "rope": {"method": "yarn", "target_length": 256}, "lora": NEOX_LORA,
         "train": {"memory": {"tiled_mlp": True}}}, "train.memory.tiled_mlp", "this model's MLP is not one"),
    "a CUDA optimizer without CUDA": ({"train": {"optimizer": "paged_adamw_8bit"}}, "train.optimizer",
                                      "pages optimizer state through CUDA"),
    "a ring without CUDA": ({"train": {"context_parallel_size": 2}}, "train.context_parallel_size",
                            "runs only CUDA SDPA kernels"),
    "a ring with PoSE": ({"train": {"context_parallel_size": 2, "pose": {"chunks": 2}, "seq_len": 256}},
                         "train.context_parallel_size", "PoSE, data.document_mask and data.short_fraction need 1"),
    "flash attention without CUDA": ({"model": {"attn_implementation": "flash_attention_2"}},
                                     "model.attn_implementation", "flash_attention_2 needs CUDA"),
    "offloaded checkpoints without CUDA": ({"train": {"memory": {"offload_checkpoints": True}}},
                                           "train.memory.offload_checkpoints", "needs pinned CUDA memory"),
    "a bf16 residual stream on an fp32 CPU run": ({"train": {"memory": {"residual_dtype": "bf16"}}},
                                                  "train.memory.residual_dtype", "bf16 needs a bf16 run"),
    "an fp32 residual stream that would upcast": ({"quantization": {"compute_dtype": "bfloat16"},
                                                   "train": {"memory": {"residual_dtype": "fp32"}}},
                                                  "train.memory.residual_dtype", "fp32 would upcast"),
    "a probe longer than the model is extended to": ({"train": {"probe": {"length": 1024, "interval": 1}}},
                                                     "train.probe.length", "1024 is longer than the model is extended"),
    "a probe of zero trials": ({"train": {"probe": {"trials": 0, "interval": 1}}}, "train.probe.trials",
                               "0 trials measure nothing"),
    "a probe with a depth left without a key": ({"train": {"probe": {"trials": 3, "interval": 1}}},
                                                 "train.probe.trials", "3 keys leave some of train.probe.depths' 5"),
    "a probe interval past the step ceiling": ({"train": {"probe": {"interval": 5}}}, "train.probe.interval",
                                               "5 is larger than train.max_steps (1)"),
    "a probe without held-out documents": ({"data": {"path": "builtin:stdlib", "validation_fraction": 0},
                                            "train": {"probe": {"interval": 1}}}, "data.validation_fraction",
                                           "train.probe draws its documents from the held-out validation split"),
    "a probe on a corpus of the evaluation's files": ({"data": {"path": "builtin:stdlib-heldout"},
                                                       "train": {"probe": {"interval": 1}}}, "data.path",
                                                      "so train.probe's stop would be chosen on the data"),
    "a full fine-tune asked to quantize": ({"train": {"mode": "full"}, "quantization": {"mode": "nf4"}},
                                           "quantization.mode", "a full fine-tune trains every weight"),
    "LoRA settings in a full fine-tune": ({"train": {"mode": "full"}, "lora": {"r": 8}}, "lora",
                                          "LoRA settings mean nothing in a full fine-tune"),
    "QLoRA on an unquantized base": ({"train": {"mode": "qlora"}}, "quantization.mode",
                                     "train.mode qlora trains adapters on a quantized base"),
    "LoRA on a quantized base": ({"train": {"mode": "lora"}, "quantization": {"mode": "int8"}}, "quantization.mode",
                                 "train.mode lora trains adapters on an unquantized base"),
}  # fmt: skip
if importlib.util.find_spec("wandb") is None:
    CASES["a tracker that is not installed"] = ({"train": {"tracker": "wandb"}}, "train.tracker", "not installed")
CUDA_ONLY = {"a CUDA optimizer", "a ring without", "flash attention", "offloaded checkpoints", "a bf16 residual"}


def squash(text: str) -> str:
    """The text without whitespace: a console wraps long lines wherever it likes."""
    return "".join(text.split())


def write_case(tmp_path: Path, changes: dict, model_dir: Path) -> Path:
    data = {
        "model": {"path": str(model_dir)},
        "rope": {"method": "yarn", "target_length": 512},
        "quantization": {"mode": "none"},
        "data": {"path": "builtin:stdlib"},
        "train": {"max_steps": 1},
        "output": {"dir": str(tmp_path / "run")},
    }
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    if data["rope"]["method"] == "none":
        data["rope"] = {"method": "none"}
    text = yaml.safe_dump(data).replace("{tmp}", str(tmp_path))
    (tmp_path / "latin1.txt").write_bytes("café au lait\n".encode("latin-1") * 50)
    path = tmp_path / "r.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_validate_refuses_what_train_refuses_with_the_same_message(case, tmp_path, tiny_model_dir):
    changes, key, words = CASES[case]
    if any(case.startswith(c) for c in CUDA_ONLY) and torch.cuda.is_available():
        pytest.skip("the machine has CUDA: the setting is valid here")
    path = write_case(tmp_path, changes, tiny_model_dir)
    checked = runner.invoke(app, ["validate", str(path)])
    assert checked.exit_code == 2, checked.output
    assert squash(f"{key}: ") in squash(checked.output) and squash(words) in squash(checked.output), checked.output
    # The library's train() refuses it before it launches or loads anything, with that very problem.
    with pytest.raises(RecipeError) as refused:
        train(load_recipe(path))
    message = next((m for k, m in refused.value.problems if k == key and words in m), None)
    assert message is not None, refused.value.problems
    assert squash(f"{key}: {message}") in squash(checked.output)
    trained = runner.invoke(app, ["train", str(path)])
    assert trained.exit_code == 2, trained.output
    assert squash(f"{key}: {message}") in squash(trained.output), trained.output
    assert "Traceback" not in checked.output + trained.output
    assert not (tmp_path / "run").exists()


def test_every_refusal_key_has_a_case():
    # A refusal added to the module without a recipe that triggers it here fails this test.
    tree = ast.parse((ROOT / "ctxext" / "recipe" / "refusals.py").read_text())
    keys = {
        node.elts[0].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Tuple)
        and len(node.elts) == 2
        and isinstance(node.elts[0], ast.Constant)
        and isinstance(node.elts[0].value, str)
        and re.fullmatch(r"(model|rope|data|lora|train|quantization)(\.\w+)*", node.elts[0].value)
    }
    assert {"lora.target_modules", "model.path", "rope", "train.memory.tiled_mlp"} <= keys, keys
    covered = {key for _, key, _ in CASES.values()} | {"train.tracker"}  # installed here: Machine tests below
    assert keys <= covered, f"refusals without a case: {sorted(keys - covered)}"


def _recipe(tmp_path: Path, model_dir: Path, **changes):
    return load_recipe(write_case(tmp_path, changes, model_dir))


CPU = Machine(cuda=False, packages=frozenset())
GPU = Machine(cuda=True, packages=frozenset({"flash_attn", "deepspeed", "tensorboard", "wandb"}))


def test_what_the_machine_decides(tmp_path, tiny_model_dir):
    """The machine-dependent refusals, on a described machine: CUDA-only settings pass on a CUDA machine."""
    gpu_settings = {
        "model": {"attn_implementation": "flash_attention_2"},
        "train": {"optimizer": "paged_adamw_8bit", "memory": {"offload_checkpoints": True, "residual_dtype": "bf16"}},
    }
    recipe = _recipe(tmp_path, tiny_model_dir, **gpu_settings)
    assert refusals(recipe, GPU).problems == []
    keys = [key for key, _ in refusals(recipe, CPU).problems]
    assert keys == ["train.optimizer", "model.attn_implementation", "train.memory.residual_dtype"], keys
    # Without DeepSpeed a split is refused, naming what installs it; so is a tracker that is not installed.
    recipe = _recipe(tmp_path, tiny_model_dir, train={"sequence_parallel_size": 2, "tracker": "wandb"})
    problems = dict(refusals(recipe, CPU).problems)
    assert (
        "with DeepSpeed's Ulysses attention; pip install 'ctxext[deepspeed]'"
        in problems["train.sequence_parallel_size"]
    )
    assert "wandb is not installed; pip install wandb" == problems["train.tracker"]
    assert refusals(recipe, GPU).problems == []
    # The ring needs CUDA's SDPA kernels: on a CUDA machine with SDPA it runs, with flash attention it is refused.
    recipe = _recipe(
        tmp_path, tiny_model_dir, train={"context_parallel_size": 2}, model={"attn_implementation": "sdpa"}
    )
    assert refusals(recipe, GPU).problems == []
    assert [k for k, _ in refusals(recipe, CPU).problems] == ["train.context_parallel_size"]
    recipe = _recipe(tmp_path, tiny_model_dir, train={"context_parallel_size": 2})  # auto: flash attention on GPU
    assert (
        "the ring replaces SDPA, not flash_attention_2"
        in dict(refusals(recipe, GPU).problems)["train.context_parallel_size"]
    )
    # Offloading needs checkpoints to offload, on any machine.
    recipe = _recipe(
        tmp_path,
        tiny_model_dir,
        train={"gradient_checkpointing": False, "memory": {"offload_checkpoints": True}},
        quantization={"compute_dtype": "bfloat16"},
    )
    assert [k for k, _ in refusals(recipe, GPU).problems] == ["train.memory.offload_checkpoints"]


def test_validate_says_what_the_launch_needs(tmp_path, tiny_model_dir):
    path = write_case(tmp_path, {"train": {"sequence_parallel_size": 2}}, tiny_model_dir)
    checked = runner.invoke(app, ["validate", str(path)])
    if importlib.util.find_spec("deepspeed") is None:
        assert checked.exit_code == 2 and "ctxext[deepspeed]" in checked.output
        return
    assert checked.exit_code == 0, checked.output
    assert "`ctxext train` must be launched on a multiple of 2" in " ".join(checked.output.split())


def test_importing_the_refusals_does_not_import_torch():
    code = "import sys, ctxext.recipe.refusals\nprint('torch' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
