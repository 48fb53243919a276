"""Recipe schema: shipped recipes validate; typos and bad values are reported together, by key."""

from __future__ import annotations

import pytest
import yaml

from ctxext.recipe.schema import RecipeError, apply_overrides, dump_recipe, load_recipe, parse_recipe
from tests.helpers import ROOT

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))

MINIMAL = {
    "model": {"path": "builtin:tiny-llama"},
    "rope": {"method": "yarn", "target_length": 1024},
    "data": {"path": "builtin:stdlib"},
}


def test_there_are_shipped_recipes():
    names = {p.name for p in RECIPES}
    assert {"llama2-7b-yarn-32k.yaml", "llama3-8b-yarn-64k.yaml", "mistral-7b-yarn-32k.yaml"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_validates_and_shows_its_command(path):
    recipe = load_recipe(path)
    assert recipe.seq_len > 0
    header = path.read_text().splitlines()[:15]
    assert any("ctxext train" in line for line in header if line.startswith("#")), "header must give the command"


def test_defaults_and_seq_len_from_target():
    recipe = parse_recipe(MINIMAL)
    assert recipe.seq_len == 1024
    assert recipe.quantization.mode == "nf4"
    assert recipe.lora.target_modules == ["all-linear"] and recipe.lora.extra_trainable == ["embeddings", "norm"]
    assert yaml.safe_load(dump_recipe(recipe))["rope"]["target_length"] == 1024


def test_all_problems_reported_at_once_each_named():
    data = {
        "modle": {"path": "x"},
        "rope": {"method": "yarn", "target_length": 1024, "beta_fastt": 3},
        "data": {"path": "d"},
        "train": {"max_steps": -1, "lr": 1},
    }
    with pytest.raises(RecipeError) as info:
        parse_recipe(data)
    keys = {key for key, _ in info.value.problems}
    assert "modle" in keys
    assert "model" in keys
    assert "rope.beta_fastt" in keys
    assert "train.max_steps" in keys
    assert "train.lr" in keys


def test_method_option_mismatch_and_unknown_method():
    bad = {**MINIMAL, "rope": {"method": "linear", "target_length": 1024, "beta_fast": 16}}
    with pytest.raises(RecipeError) as info:
        parse_recipe(bad)
    assert info.value.problems[0][0] == "rope.beta_fast"
    with pytest.raises(RecipeError, match="unknown method"):
        parse_recipe({**MINIMAL, "rope": {"method": "magic", "target_length": 1024}})


def test_seq_len_longer_than_target_is_rejected():
    with pytest.raises(RecipeError) as info:
        parse_recipe({**MINIMAL, "train": {"seq_len": 4096}})
    assert info.value.problems[0][0] == "train.seq_len"


def test_overrides_are_typed_and_nested():
    data = apply_overrides(
        yaml.safe_load(yaml.safe_dump(MINIMAL)),
        [
            "train.max_steps=7",
            "lora.target_modules=[q_proj, v_proj]",
            "output.dir=/tmp/x",
            "hub.private=false",
        ],
    )
    recipe = parse_recipe(data)
    assert recipe.train.max_steps == 7
    assert recipe.lora.target_modules == ["q_proj", "v_proj"]
    assert recipe.output.dir == "/tmp/x"
    assert recipe.hub.private is False
    with pytest.raises(RecipeError):
        apply_overrides({}, ["no-equals-sign"])


def test_overrides_index_lists_and_name_the_key():
    data = {**yaml.safe_load(yaml.safe_dump(MINIMAL)), "data": {"mixture": [{"path": "builtin:stdlib", "weight": 1}]}}
    apply_overrides(data, ["data.mixture.0.weight=0.5", "data.mixture.1={task: needle, weight: 0.5}"])
    assert data["data"]["mixture"] == [{"path": "builtin:stdlib", "weight": 0.5}, {"task": "needle", "weight": 0.5}]
    with pytest.raises(RecipeError) as info:
        apply_overrides(
            data, ["data.mixture.3.weight=1", "data.mixture.x=1", "train.max_steps=1", "train.max_steps.x=1"]
        )
    problems = dict(info.value.problems)
    assert (
        problems["data.mixture.3.weight"]
        == "data.mixture is a list of 2 item(s): give an index below 2, or 2 to add one"
    )
    assert "data.mixture.x" in problems and problems["train.max_steps.x"] == "max_steps is not a section"
    assert len(data["data"]["mixture"]) == 2


def test_push_needs_repo_id():
    with pytest.raises(RecipeError) as info:
        parse_recipe({**MINIMAL, "hub": {"push": True}})
    assert info.value.problems[0][0] == "hub.repo_id"


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(RecipeError):
        load_recipe(bad)
