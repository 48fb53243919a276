"""What a recipe leaves to the machine (auto checkpointing, a micro-batch that may shrink), decided from the plan.

Config-only (the bundled Llama-2 config and a tiny model's folder): no weights are loaded except in the one test
that trains.
"""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.models.devices import GIB, Device, cpu_device, gpu
from ctxext.planner.autofit import ACCUMULATION, CHECKPOINTING, MICRO_BATCH, saved_overrides
from ctxext.planner.fit import HEADROOM
from ctxext.planner.plan import plan_recipe
from ctxext.recipe.schema import load_recipe

runner = CliRunner()
LLAMA2 = "recipes/llama2-7b-yarn-32k.yaml"
H100 = gpu("h100-80gb")


def _llama2(*overrides: str):
    given = ["train.gradient_checkpointing=auto", "train.micro_batch_size=8", "train.gradient_accumulation_steps=1"]
    return load_recipe(LLAMA2, [*given, *overrides])


def test_auto_checkpointing_stays_off_where_the_step_fits(tiny_model_dir):
    recipe = load_recipe("recipes/tiny-cpu.yaml", [f"model.path={tiny_model_dir}", "train.gradient_checkpointing=auto"])
    plan = plan_recipe(recipe, Device("big", 64 * GIB, None, "cpu"), search=False)
    assert plan.choice is not None and plan.choice.as_given and plan.choice.fits
    assert plan.choice.overrides == {CHECKPOINTING: False, MICRO_BATCH: 2, ACCUMULATION: 1}
    assert not plan.setup.checkpointing and plan.setup.micro_batch == 2
    assert "train.gradient_checkpointing auto → false: the step fits without recomputation" in plan.choice.line


def test_a_smaller_micro_batch_is_tried_before_recomputation():
    # Flash-attention, rows of 4,096 tokens: 8 of them without recomputation plan ~190 GiB; 2 fit an H100.
    plan = plan_recipe(_llama2("model.attn_implementation=flash_attention_2", "train.seq_len=4096"), H100, search=False)
    chosen = plan.choice.overrides
    assert chosen[CHECKPOINTING] is False and chosen[MICRO_BATCH] < 8
    assert chosen[MICRO_BATCH] * chosen[ACCUMULATION] == 8  # the same rows per step
    assert plan.fits
    assert (plan.setup.micro_batch, plan.setup.accumulation) == (chosen[MICRO_BATCH], chosen[ACCUMULATION])
    assert "(the same rows per step)" in plan.choice.line and not plan.choice.as_given


def test_recomputation_turns_on_with_the_largest_micro_batch_that_then_fits():
    plan = plan_recipe(_llama2("train.seq_len=16384"), H100, search=False)
    assert plan.choice.overrides == {CHECKPOINTING: True, MICRO_BATCH: 8, ACCUMULATION: 1}
    assert plan.fits and plan.setup.checkpointing
    assert "train.gradient_checkpointing auto → true:" in plan.choice.line


def test_when_nothing_fits_the_most_saving_choice_is_planned_and_the_plan_says_so():
    plan = plan_recipe(_llama2("rope.target_length=1048576", "train.seq_len=1048576"), H100, search=False)
    assert plan.choice.overrides == {CHECKPOINTING: True, MICRO_BATCH: 1, ACCUMULATION: 8}
    assert not plan.choice.fits and not plan.fits and plan.advice
    assert "the step still plans" in plan.choice.line


def test_explicit_settings_and_deepspeed_are_left_as_given():
    fixed = load_recipe(LLAMA2, ["train.micro_batch_size=8", "train.memory.fit_micro_batch=false"])
    assert plan_recipe(fixed, H100, search=False).choice is None
    # ZeRO-3 takes accumulation 1: a smaller micro-batch would be a smaller batch, which is the user's call.
    zero3 = plan_recipe(_llama2(), H100, num_gpus=2, sharding="zero3", search=False)
    assert zero3.choice.overrides == {CHECKPOINTING: True}


def test_ctxext_plan_says_what_it_decided():
    result = runner.invoke(app, ["plan", LLAMA2, "--gpu", "h100-80gb", "train.gradient_checkpointing=auto"])
    assert result.exit_code == 0, result.output
    assert "settings left to the machine: train.gradient_checkpointing auto →" in " ".join(result.output.split())


def test_a_resumed_run_keeps_the_choice_it_made():
    recipe = _llama2()
    saved = {"train": {"gradient_checkpointing": True, "micro_batch_size": 2, "gradient_accumulation_steps": 4}}
    assert saved_overrides(recipe, saved) == {CHECKPOINTING: True, MICRO_BATCH: 2, ACCUMULATION: 4}
    # Other rows per step are another recipe: not taken (the resume check names the difference).
    other = {"train": {"gradient_checkpointing": False, "micro_batch_size": 2, "gradient_accumulation_steps": 2}}
    assert saved_overrides(recipe, other) == {CHECKPOINTING: False}
    assert saved_overrides(load_recipe(LLAMA2, ["train.gradient_checkpointing=true"]), saved) == {}


def test_processes_sharing_a_cpu_plan_the_same_share_of_its_ram():
    one, two = cpu_device(), cpu_device(2)
    assert two.memory == cpu_device(2).memory  # not what happens to be free at the moment
    assert "1/2 of" in two.name and two.memory < one.memory + 2 * GIB


def _small_machine(monkeypatch, gib: float) -> None:
    """This machine as one with ``gib`` of RAM, for the plan ``ctxext train`` makes before anything is loaded."""
    import ctxext.planner.plan as plan

    monkeypatch.setattr(plan, "this_device", lambda: (Device("small", int(gib * GIB), None, "cpu"), 1, None))


@pytest.mark.slow
def test_train_decides_before_loading_and_the_run_keeps_it(tiny_model_dir, tmp_path, monkeypatch):
    out = tmp_path / "run"
    args = [
        "train", "recipes/tiny-cpu.yaml", f"model.path={tiny_model_dir}", f"output.dir={out}", "train.max_steps=2",
        "train.gradient_checkpointing=auto", "train.micro_batch_size=4", "train.eval_every=null",
        "train.save_every=null", "data.max_documents=24",
    ]  # fmt: skip
    # A machine just large enough for the step with recomputation (as the plan itself sizes it): the recipe's own
    # micro-batch without it does not fit there.
    big = Device("big", 64 * GIB, None, "cpu")
    recipe = load_recipe(args[1], args[2:])
    on = load_recipe(args[1], [*args[2:], "train.gradient_checkpointing=true"])
    off = load_recipe(args[1], [*args[2:], "train.gradient_checkpointing=false"])
    need = plan_recipe(on, big, search=False, decide=False).band.high
    assert plan_recipe(off, big, search=False, decide=False).band.high > need
    sized = need / (1 - HEADROOM) / GIB * 1.001
    _small_machine(monkeypatch, sized)
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "settings left to the machine:" in said
    saved = yaml.safe_load((out / "recipe.yaml").read_text())["train"]
    assert saved["micro_batch_size"] * saved["gradient_accumulation_steps"] == 4
    assert (saved["micro_batch_size"], saved["gradient_checkpointing"]) != (4, False)  # something was given up
    # Continued on a machine where everything fits, the run keeps its batches (its data order depends on them).
    from ctxext.cli.train_commands import fit_to_this_machine

    _small_machine(monkeypatch, 64)
    fresh = fit_to_this_machine(recipe, "ctxext plan")
    assert fresh.recipe.train.micro_batch_size == 4 and fresh.recipe.train.checkpointing is False
    kept = fit_to_this_machine(recipe, "ctxext plan", resume=True)
    assert "as the run chose when it started" in kept.line
    assert kept.recipe.train.micro_batch_size == saved["micro_batch_size"]
    assert kept.recipe.train.gradient_checkpointing == saved["gradient_checkpointing"]
