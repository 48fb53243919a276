"""`ctxext validate` refuses what `ctxext train` refuses before loading weights, with the same message: both run
:func:`ctxext.training.preflight.preflight_problems`."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.recipe.schema import RecipeError, load_recipe
from ctxext.training.run import train

runner = CliRunner()

# Each: recipe changes, the key named, words of the message. All were accepted by validate and refused by train
# only once the model (or the data) was loaded.
CASES = {
    "LoRA module the model lacks": ({"lora": {"target_modules": ["q_proj", "qkv_proj"]}}, "lora.target_modules",
                                    "qkv_proj match no module of this model"),
    "builtin data read in another field": ({"data": {"path": "builtin:stdlib", "text_field": "content"}},
                                           "data.text_field", "has only the field 'text'"),
    "unknown builtin split": ({"data": {"path": "builtin:stdlib-nope"}}, "data.path", "nope"),
    "short blocks without a rope method": ({"rope": {"method": "none"}, "train": {"seq_len": 256},
                                            "data": {"path": "builtin:stdlib", "short_fraction": 0.2}},
                                           "data.short_fraction", "needs the model's original length"),
    "unpacked examples shorter than a row": ({"data": {"path": "builtin:stdlib", "packing": False, "min_tokens": 64}},
                                             "data.min_tokens", "64 is below train.seq_len (512)"),
    "a CUDA optimizer without CUDA": ({"train": {"optimizer": "paged_adamw_8bit"}}, "train.optimizer",
                                      "pages optimizer state through CUDA"),
    "a ring without CUDA": ({"train": {"context_parallel_size": 2}}, "train.context_parallel_size",
                            "runs only CUDA SDPA kernels"),
    "a head split wider than the heads": ({"train": {"sequence_parallel_size": 8}}, "train.sequence_parallel_size",
                                          "8 exceeds the model's 4 attention heads"),
}  # fmt: skip
if importlib.util.find_spec("wandb") is None:
    CASES["a tracker that is not installed"] = ({"train": {"tracker": "wandb"}}, "train.tracker", "not installed")


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("case", list(CASES))
def test_validate_refuses_what_train_refuses_with_the_same_message(case, tmp_path, tiny_model_dir):
    changes, key, words = CASES[case]
    if "CUDA" in case and torch.cuda.is_available():
        pytest.skip("the machine has CUDA: the setting is valid here")
    data = {
        "model": {"path": str(tiny_model_dir)},
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
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(data))
    checked = runner.invoke(app, ["validate", str(path)])
    assert checked.exit_code == 2, checked.output
    assert f"{key}: " in flat(checked.output) and words in flat(checked.output), checked.output
    # The library's train() refuses it before loading anything, with that very problem.
    with pytest.raises(RecipeError) as refused:
        train(load_recipe(path))
    problems = dict(refused.value.problems)
    assert words in problems[key] and f"{key}: {problems[key]}" in flat(checked.output)
    trained = runner.invoke(app, ["train", str(path)])
    assert trained.exit_code == 2 and f"{key}: {problems[key]}" in flat(trained.output), trained.output
    assert not (tmp_path / "run").exists()
