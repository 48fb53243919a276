"""The run folder's recipe check: a resumed run must have its recipe, and a key added since it started is no change."""

from __future__ import annotations

import yaml

from ctxext.recipe.schema import dump_recipe, parse_recipe
from ctxext.training.folder import recipe_diffs

RECIPE = {"model": {"path": "builtin:tiny-llama"}, "rope": {"method": "yarn", "target_length": 512},
          "data": {"path": "builtin:stdlib"}}  # fmt: skip


def test_a_key_added_since_the_run_started_counts_as_its_default():
    current = dump_recipe(parse_recipe(RECIPE))
    written = yaml.safe_load(current)
    del written["calibrate"]  # a run folder written before the calibrate: section existed
    assert recipe_diffs(yaml.safe_dump(written), current) == []
    # A setting that differs still shows (seq_len: None is "the base's window" by default).
    changed = dump_recipe(parse_recipe({**RECIPE, "calibrate": {"when": "never"}}))
    assert recipe_diffs(yaml.safe_dump(written), changed) == ["calibrate.when: 'auto' → 'never'"]
    assert recipe_diffs(current, dump_recipe(parse_recipe({**RECIPE, "train": {"seq_len": 256}}))) == [
        "train.seq_len: None → 256"
    ]


def test_a_saved_recipe_the_schema_no_longer_reads_is_compared_as_written():
    current = yaml.safe_load(dump_recipe(parse_recipe(RECIPE)))
    written = {**current, "train": {**current["train"], "retired_key": 1}}
    assert "train.retired_key: 1 → None" in recipe_diffs(yaml.safe_dump(written), yaml.safe_dump(current))


def test_settings_that_only_keep_the_run_may_change_on_resume():
    current = dump_recipe(parse_recipe(RECIPE))
    # A long run started without checkpoints resumes with them (and with another log cadence or tracker).
    kept = {"save_every": 5, "keep_checkpoints": 3, "log_every": 10, "tracker": "tensorboard"}
    assert recipe_diffs(current, dump_recipe(parse_recipe({**RECIPE, "train": kept}))) == []
    # What the run learns still has to match, also beside a keeping change.
    learns = dump_recipe(parse_recipe({**RECIPE, "train": {"save_every": 5, "learning_rate": 1e-4}}))
    assert recipe_diffs(current, learns) == ["train.learning_rate: 0.0002 → 0.0001"]
