"""Training mixtures: corpora, synthetic tasks and short blocks; PoSE and document masking in a real run."""

from __future__ import annotations

import json

import pytest
import torch

from ctxext.recipe.schema import RecipeError, load_recipe, parse_recipe
from ctxext.training.data.mixture import allocate
from ctxext.training.run import read_run, train
from tests.helpers.train import write_recipe


def test_allocate_is_exact_and_deterministic():
    assert allocate(10, [0.5, 0.3, 0.2]) == [5, 3, 2]
    assert allocate(7, [1, 1, 1]) == [3, 2, 2]
    assert sum(allocate(961, [0.37, 0.21, 0.42])) == 961


def test_pose_document_mask_and_short_blocks_train(tmp_path, cache_root):
    recipe = load_recipe(
        write_recipe(
            tmp_path / "r.yaml",
            tmp_path / "run",
            rope={"method": "yarn", "target_length": 1024},
            data={"document_mask": True, "short_fraction": 0.5},
            train={"seq_len": 512, "max_steps": 2, "pose": {"chunks": 2}, "eval_every": 2, "eval_batches": 1},
        )
    )
    result = train(recipe)
    run = read_run(result.run_dir)
    assert run.status == "complete" and run.final_val_loss is not None
    mixture = json.loads((result.run_dir / "mixture.json").read_text())["realised"]
    assert mixture["rows"] == 4 and run.mixture == mixture
    short = [s for s in mixture["sources"] if s["source"].startswith("short:")]
    assert short and short[0]["rows"] == 2 and short[0]["block_tokens"] == 256


MIX = {
    "model": {"path": "builtin:tiny-llama"},
    "rope": {"method": "yarn", "target_length": 512},
    "data": {"mixture": [{"path": "builtin:stdlib", "weight": 0.5}, {"task": "needle", "weight": 0.5}]},
    "train": {"seq_len": 512},
}


def _mix(*sources, **data):
    recipe = {k: dict(v) for k, v in MIX.items()}
    recipe["data"] = {"mixture": list(sources), **data}
    return recipe


def test_mixture_recipe_errors_name_their_keys():
    assert parse_recipe(MIX).data.mixture[1].task == "needle"
    with pytest.raises(RecipeError) as err:
        parse_recipe(_mix({"task": "nedle", "weight": 1}, {"path": "builtin:stdlib", "weight": -1}))
    problems = dict(err.value.problems)
    assert "unknown task 'nedle'" in problems["data.mixture.0.task"] and "multikey" in problems["data.mixture.0.task"]
    assert "negative" in problems["data.mixture.1.weight"]
    with pytest.raises(RecipeError, match="sum to 0") as err:
        parse_recipe(_mix({"path": "builtin:stdlib", "weight": 0}))
    assert err.value.problems[0][0] == "data.mixture"
    with pytest.raises(RecipeError) as err:
        parse_recipe(_mix({"path": "builtin:stdlib", "task": "needle", "weight": 1}))
    assert err.value.problems[0][0] == "data.mixture.0.path"
    with pytest.raises(RecipeError) as err:
        parse_recipe(_mix({"path": "builtin:stdlib", "weight": 1, "distractors": 2}))
    assert "not an option of a corpus" in err.value.problems[0][1]
    with pytest.raises(RecipeError, match="path: required"):
        parse_recipe({**MIX, "data": {}})


def test_validate_command_reports_mixture_problems(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from ctxext.cli.commands import app

    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(_mix({"task": "nope", "weight": 1}, {"path": "builtin:stdlib", "weight": -2})))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "data.mixture.0.task" in result.output and "data.mixture.1.weight" in result.output
    assert list(tmp_path.iterdir()) == [path]


def test_task_rows_are_deterministic_cover_depths_and_answer_only(tiny_tokenizer):
    from types import SimpleNamespace

    from ctxext.training.data.mixture import prepare_training_data

    recipe = parse_recipe(
        _mix(
            {"path": "builtin:stdlib", "weight": 1, "max_documents": 8},
            {"task": "needle", "weight": 2, "answer_only": True, "min_length": 128, "templates": [0]},
            short_fraction=0.25,
            validation_fraction=0.2,
            num_proc=1,
        )
    )
    plan = SimpleNamespace(original_length=256, target_length=512)
    a = prepare_training_data(recipe, tiny_tokenizer, plan, rows=12)
    b = prepare_training_data(recipe, tiny_tokenizer, plan, rows=12)
    rows = a.train.with_format(None)
    assert rows["input_ids"] == b.train.with_format(None)["input_ids"]
    sources = {s["source"]: s for s in a.mixture["realised"]["sources"]}
    assert sources["task:needle"]["rows"] == 6 and sources["builtin:stdlib"]["rows"] == 3
    assert sources["short:builtin:stdlib"]["rows"] == 3
    assert sources["task:needle"]["samples"]["template 0"] == sources["task:needle"]["samples"]["samples"]
    assert rows["pose"].count(0) == 3  # short rows keep their own positions (no PoSE)
    # answer_only: in task rows only answer tokens are targets; every segment is a whole sample.
    task_rows = [i for i in range(12) if sum(rows["targets"][i]) < 512]
    assert len(task_rows) == 6
    for i in task_rows:
        segs, tg = torch.tensor(rows["segments"][i]), torch.tensor(rows["targets"][i])
        assert 0 < int(tg.sum()) <= 8 * (int(segs.max()) + 1)
        lengths = torch.bincount(segs)
        assert int(lengths.min()) >= 128 and int(lengths.sum()) == 512


def test_task_that_cannot_fit_names_its_source(tiny_tokenizer):
    from types import SimpleNamespace

    from ctxext.errors import InputError
    from ctxext.training.data.mixture import prepare_training_data

    recipe = parse_recipe(
        _mix(
            {"path": "builtin:stdlib", "weight": 1, "max_documents": 4},
            {"task": "multikey", "weight": 1, "distractors": 60, "min_length": 64},
            num_proc=1,
        )
    )
    with pytest.raises(InputError, match=r"data.mixture\[1\]: task multikey: length \d+ cannot hold"):
        prepare_training_data(recipe, tiny_tokenizer, SimpleNamespace(original_length=256, target_length=512), 2)


def test_task_max_length_bounds_sample_lengths(tiny_tokenizer):
    from types import SimpleNamespace

    from ctxext.training.data.mixture import prepare_training_data

    recipe = parse_recipe(
        _mix(
            {"path": "builtin:stdlib", "weight": 1, "max_documents": 4},
            {"task": "needle", "weight": 3, "min_length": 96, "max_length": 128, "templates": [0]},
            num_proc=1,
        )
    )
    data = prepare_training_data(recipe, tiny_tokenizer, SimpleNamespace(original_length=256, target_length=512), 8)
    rows = data.train.with_format(None)
    task_rows = [i for i in range(8) if max(rows["segments"][i]) > 0]
    assert len(task_rows) == 6
    for i in task_rows:
        lengths = torch.bincount(torch.tensor(rows["segments"][i])).tolist()
        # Every sample but a row's last is 96-128 tokens; the last takes what is left (< 96 + 128).
        assert all(96 <= n <= 128 for n in lengths[:-1]) and 96 <= lengths[-1] < 96 + 128
        assert sum(lengths) == 512


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ({"task": "needle", "weight": 1, "min_length": 128, "max_length": 64}, "max_length: 64 is below min_length"),
        ({"path": "builtin:stdlib", "weight": 1, "max_length": 64}, "max_length: not an option of a corpus"),
    ],
)
def test_max_length_errors(source, message):
    with pytest.raises(RecipeError, match=message):
        parse_recipe(_mix({"path": "builtin:stdlib", "weight": 1}, source))


def _random_docs(n: int, seed: int = 0) -> list[str]:
    """Documents of random words: any 12 tokens they share with another text were copied from them."""
    import random
    import string

    rng = random.Random(seed)
    return [" ".join("".join(rng.choices(string.ascii_lowercase, k=5)) for _ in range(30)) for _ in range(n)]


def _grams(rows, n: int = 12) -> set[tuple[int, ...]]:
    return {tuple(r[i : i + n]) for r in rows for i in range(len(r) - n + 1)}


def test_training_rows_hold_no_validation_text_and_honour_max_documents(tmp_path, tiny_tokenizer):
    from types import SimpleNamespace

    from ctxext.training.data.corpus import prepare_data
    from ctxext.training.data.mixture import prepare_training_data

    docs = _random_docs(24)
    corpus, other = tmp_path / "corpus.jsonl", tmp_path / "copy.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    other.write_text(corpus.read_text())  # the same documents under another path: a separate haystack
    recipe = parse_recipe(
        _mix(
            {"path": str(corpus), "weight": 1},
            {"task": "needle", "weight": 1, "min_length": 64, "templates": [0]},
            {"task": "needle", "weight": 1, "min_length": 64, "templates": [1], "haystack": str(other)},
            short_fraction=0.25,
            max_documents=16,
            validation_fraction=0.25,
            num_proc=1,
        )
        | {"train": {"seq_len": 128}}
    )
    data = prepare_training_data(recipe, tiny_tokenizer, SimpleNamespace(original_length=64, target_length=256), 48)
    trained = _grams(data.train.with_format(None)["input_ids"])
    held_out = data.validation_documents["text"]
    assert len(held_out) == 4 and data.validation is not None
    for text in held_out:  # the validation blocks' documents, tokenized alone
        assert not _grams([tiny_tokenizer(text, add_special_tokens=False)["input_ids"]]) & trained, text[:30]
    assert not _grams(data.validation.with_format(None)["input_ids"]) & trained
    for text in docs[16:]:  # beyond max_documents: read by nothing
        assert not _grams([tiny_tokenizer(text, add_special_tokens=False)["input_ids"]]) & trained, text[:30]
    # The check can fail: the training documents themselves are all over the rows.
    section = recipe.data.model_copy(update={"path": str(corpus), "mixture": None})
    seen = prepare_data(section, tiny_tokenizer, 128, seed=recipe.train.seed).train_documents["text"]
    found = sum(bool(_grams([tiny_tokenizer(t, add_special_tokens=False)["input_ids"]]) & trained) for t in seen)
    assert found >= len(seen) - 2, (found, len(seen))
