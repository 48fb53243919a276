"""Lengths as multiples of the model's window: one recipe fits every base, and a bad multiple names its key."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from ctxext.cli.commands import app
from ctxext.recipe.schema import Recipe, RecipeError, dump_recipe, load_recipe, parse_recipe
from ctxext.recipe.window import declared_window_keys, multiple_of
from tests.helpers import ROOT

DEFAULT = ROOT / "recipes" / "default.yaml"


def _minimal(**rope):
    return {
        "model": {"path": "builtin:grown-code-64"},
        "rope": {"method": "llama3", **rope},
        "data": {"path": "builtin:stdlib"},
    }


def test_the_length_keys_accept_multiples_and_say_so_in_the_schema():
    assert declared_window_keys(Recipe) == [
        "rope.target_length",
        "data.mixture.*.min_length",
        "data.mixture.*.max_length",
        "train.seq_len",
        "train.probe.length",
    ]
    assert [multiple_of(v) for v in ("4x", "0.5x", "2 ×", "4X", "4", 4, "x", "4y")] == [
        4.0, 0.5, 2.0, 4.0, None, None, None, None,
    ]  # fmt: skip
    from ctxext.recipe.schema import schema_lines

    line = next(s for s in schema_lines() if s.strip().startswith("rope.target_length"))
    assert "Nx: N × the model's original window" in line


def test_multiples_resolve_against_the_recipes_own_model():
    recipe = parse_recipe(_minimal(target_length="4x") | {"train": {"seq_len": "2x", "pose": {"chunks": 2}}})
    assert (recipe.rope.target_length, recipe.seq_len) == (256, 128)
    assert recipe.window_lines == [
        "rope.target_length: 4x of the model's 64-token window = 256",
        "train.seq_len: 2x of the model's 64-token window = 128",
    ]
    # What a run folder keeps is the token count: it reads the same whatever base a later recipe names.
    saved = yaml.safe_load(dump_recipe(recipe))
    assert (saved["rope"]["target_length"], saved["train"]["seq_len"]) == (256, 128)
    assert parse_recipe(saved).window_lines == []


def test_the_default_recipe_is_the_demos_and_fits_another_base():
    assert DEFAULT.is_symlink() and DEFAULT.resolve() == (ROOT / "ctxext/resources/recipes/default.yaml").resolve()
    from ctxext.cli.demo import RECIPE

    assert RECIPE.resolve() == DEFAULT.resolve()
    ours = load_recipe(DEFAULT)
    assert (ours.rope.target_length, ours.data.mixture[1].min_length) == (256, 64)  # grown-code-64-mk: 64 tokens
    other = load_recipe(DEFAULT, ["model.path=builtin:grown-mistral-128"])  # a 128-token window
    assert (other.rope.target_length, other.data.mixture[1].min_length, other.seq_len) == (512, 128, 512)
    # model.original_length, when the recipe gives it, is the window (no config is read for it).
    told = load_recipe(DEFAULT, ["model.original_length=100"])
    assert told.rope.target_length == 400


def test_the_demo_extends_any_base_four_times(tmp_path):
    from ctxext.cli.demo import resolve_demo

    run = resolve_demo(tmp_path / "demo", ["model.path=builtin:grown-mistral-128"])
    assert (run.original, run.target, run.recipe.seq_len) == (128, 512, 512)


@pytest.mark.parametrize(
    ("override", "key", "says"),
    [
        ("rope.target_length=4y", "rope.target_length", "neither a token count nor a multiple"),
        ("rope.target_length=0.001x", "rope.target_length", "under a token"),
        ("model.path=/nowhere/model", "rope.target_length", "/nowhere/model is not a folder"),
        ("data.mixture.1.min_length=ax", "data.mixture.1.min_length", "neither a token count"),
    ],
)
def test_a_multiple_that_cannot_be_resolved_names_its_key(override, key, says):
    with pytest.raises(RecipeError) as err:
        load_recipe(DEFAULT, [override])
    keys = [k for k, _ in err.value.problems]
    assert key in keys, err.value.problems
    assert says in dict(err.value.problems)[key]
    assert keys.count(key) == 1  # said once, not again as "not a valid integer"


def test_validate_says_what_the_multiples_came_to(tmp_path):
    result = CliRunner().invoke(app, ["validate", str(DEFAULT), "model.path=builtin:grown-mistral-128"])
    assert result.exit_code == 0, result.output
    assert "rope.target_length: 4x of the model's 128-token window = 512" in result.output
    bad = CliRunner().invoke(app, ["validate", str(DEFAULT), "rope.target_length=four"])
    assert bad.exit_code == 2
    assert "rope.target_length" in bad.output and "Traceback" not in bad.output
    assert json.dumps("four")[1:-1] in bad.output
