"""Needle-to-question distances of task rows: drawn from data.task_distance, realised, recorded, refused if unmet."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ctxext.recipe.schema import RecipeError, parse_recipe
from ctxext.tasks.distance import expected_shares, histogram


@pytest.fixture(scope="module")
def grown_tokenizer():
    from transformers import AutoTokenizer

    from ctxext.models.builtin import resolve_builtin

    return AutoTokenizer.from_pretrained(resolve_builtin("grown-code-64-mk"))


def _demo_recipe(tmp_path, **data):
    from ctxext.cli.demo import QUICK, RECIPE, split_overrides
    from ctxext.recipe.schema import load_recipe

    recipe = load_recipe(RECIPE, [*split_overrides(list(QUICK))[0], f"output.dir={tmp_path / 'run'}"])
    return recipe.model_copy(update={"data": recipe.data.model_copy(update=data)})


def _distance(data) -> dict:
    (entry,) = [s for s in data.mixture["realised"]["sources"] if "distance" in s]
    return entry["distance"]


@pytest.mark.parametrize("kind", ["uniform", "far"])
def test_demo_mixture_distances_follow_the_distribution(tmp_path, grown_tokenizer, kind):
    from ctxext.training.data.mixture import prepare_training_data

    recipe = _demo_recipe(tmp_path, task_distance=kind)
    data = prepare_training_data(recipe, grown_tokenizer, SimpleNamespace(original_length=64, target_length=256), 160)
    got = _distance(data)
    assert got["span"] == 256 and got["unit"] == "tokens" and got["samples"] >= 60
    expected = [100 * s for s in expected_shares(kind)]
    assert all(abs(a - b) <= 2 for a, b in zip(got["eighths_percent"], expected, strict=True)), got
    assert data.mixture["realised"]["task_distance"] == kind


def test_pose_task_rows_carry_their_positions(tmp_path, grown_tokenizer):
    from ctxext.training.data.mixture import prepare_training_data
    from ctxext.training.data.rows import build_inputs

    raw = _demo_recipe(tmp_path).model_dump(mode="json")
    raw["train"].update(pose={"chunks": 2}, seq_len=128)
    recipe = parse_recipe(raw)
    data = prepare_training_data(recipe, grown_tokenizer, SimpleNamespace(original_length=64, target_length=256), 160)
    got = _distance(data)
    assert got["span"] == 256 and got["unit"] == "positions (PoSE)"
    assert all(abs(a - 12.5) <= 2 for a in got["eighths_percent"]), got
    rows = data.train[:]
    own = rows["positions"][:, 0] >= 0
    assert int(own.sum()) > 0 and bool((rows["pose"][own] == 0).all())
    inputs = build_inputs(rows, attn_implementation="sdpa", target_length=256, pose_chunks=2, seed=0)
    assert inputs.position_ids is not None
    assert torch.equal(inputs.position_ids[own], rows["positions"][own])
    assert int(inputs.position_ids.max()) < 256
    # Positions restart at every sample (segment) and grow inside it, skipping before the needle and the question.
    starts = torch.ones_like(rows["segments"], dtype=torch.bool)
    starts[:, 1:] = rows["segments"][:, 1:] != rows["segments"][:, :-1]
    assert bool((inputs.position_ids[own][starts[own]] == 0).all())


@pytest.mark.parametrize("pose", [False, True])
def test_near_needles_also_sit_late_in_the_span(tmp_path, grown_tokenizer, pose):
    """Depth 100 at the target, a near needle after a long prefix, is trained; packed samples never reach it."""
    from collections import Counter

    from ctxext.tasks import Haystack
    from ctxext.training.data.mixture import _task_rows

    raw = _demo_recipe(tmp_path).model_dump(mode="json")
    if pose:
        raw["train"].update(pose={"chunks": 2}, seq_len=128)
    late, spread = {}, {}
    for placement in ("uniform", "packed"):
        raw["data"]["task_position"] = placement
        recipe = parse_recipe(raw)
        (source,) = [s for s in recipe.data.mixture if s.task]
        hay = Haystack.noise(grown_tokenizer, 1024)
        _, draws = _task_rows("k", source, grown_tokenizer, hay, 300, recipe, 256 if pose else None, Counter())
        summary = draws.summary()
        assert summary["placement"] == placement and summary["span"] == 256
        assert all(abs(a - 12.5) <= 2 for a in summary["eighths_percent"]), summary  # distances stay uniform
        near = [p for d, p in zip(draws.realised, draws.positions, strict=True) if d < 256 // 8]
        late[placement] = sum(p >= 192 for p in near) / len(near)
        spread[placement] = summary["position_eighths_percent"]
    assert late["packed"] == 0 and late["uniform"] >= 0.08, (late, spread)
    # Given its distance a needle sits uniformly over what is left: the last eighths are reached, sparsely.
    assert sum(spread["uniform"][4:]) >= 10 and spread["uniform"][0] <= 45, spread


def test_unknown_task_position_names_the_key():
    with pytest.raises(RecipeError) as err:
        parse_recipe({"model": {"path": "builtin:tiny-llama"}, "data": {"path": "x", "task_position": "late"}})
    message = dict(err.value.problems)["data.task_position"]
    assert "unknown placement 'late'" in message and "packed, uniform" in message


def test_unmeetable_distance_span_is_refused_naming_the_key(tmp_path, grown_tokenizer):
    from ctxext.errors import InputError
    from ctxext.training.data.mixture import prepare_training_data

    recipe = _demo_recipe(tmp_path)
    mixture = [s.model_copy(update={"max_length": 128, "min_length": 64}) if s.task else s for s in recipe.data.mixture]
    recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"mixture": mixture})})
    data = prepare_training_data(recipe, grown_tokenizer, SimpleNamespace(original_length=64, target_length=256), 8)
    assert _distance(data)["span"] == 128  # without PoSE the span is the longest sample
    mixture = [s.model_copy(update={"max_length": 40, "min_length": 32}) if s.task else s for s in mixture]
    recipe = recipe.model_copy(update={"data": recipe.data.model_copy(update={"mixture": mixture})})
    with pytest.raises(InputError, match=r"data.task_distance: uniform distances over 0–40 cannot be met by data"):
        prepare_training_data(recipe, grown_tokenizer, SimpleNamespace(original_length=64, target_length=256), 8)


def test_unknown_distribution_names_the_key():
    with pytest.raises(RecipeError) as err:
        parse_recipe(
            {
                "model": {"path": "builtin:tiny-llama"},
                "data": {"path": "builtin:stdlib", "task_distance": "farther"},
            }
        )
    message = dict(err.value.problems)["data.task_distance"]
    assert "unknown distribution 'farther'" in message and "uniform, far" in message


def test_histogram_bins():
    assert histogram([0, 31, 32, 255], 256) == [50.0, 25.0, 0, 0, 0, 0, 0, 25.0]
    assert [round(100 * s, 1) for s in expected_shares("far")] == [1.6, 4.7, 7.8, 10.9, 14.1, 17.2, 20.3, 23.4]


def test_validate_shows_the_histogram_and_refuses_an_unmeetable_span(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from ctxext.cli.commands import app

    shipped = "recipes/grown-mixture-pose.yaml"
    result = CliRunner().invoke(app, ["validate", shipped], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "needle distances" in line]
    assert len(lines) == 1 and "0–512 positions (PoSE)" in lines[0]
    shares = [float(x) for x in lines[0].split("eighth: ")[1].split(" (")[0].split()]
    assert len(shares) == 8 and all(abs(x - 12.5) <= 2 for x in shares)
    assert "packed with PoSE" not in result.output  # the shipped recipe places needles uniformly
    packed = CliRunner().invoke(app, ["validate", shipped, "data.task_position=packed"], env={"COLUMNS": "400"})
    assert "(packed with PoSE: no needle sits past position 128 of 512;" in " ".join(packed.output.split())
    raw = yaml.safe_load(open(shipped).read())
    raw["train"].pop("pose")  # without PoSE the span is the longest sample: 40 tokens cannot reach its far end
    raw["data"]["mixture"][1].update(min_length=32, max_length=40)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["validate", str(path)], env={"COLUMNS": "400"})
    assert result.exit_code == 2
    # The console may wrap the message (its width is fixed when it is first created): compare unwrapped text.
    flat = " ".join(result.output.split())
    assert "data.task_distance: uniform distances over 0–40 cannot be met by data.mixture[1]" in flat
    assert "Traceback" not in result.output and list(tmp_path.iterdir()) == [path]
