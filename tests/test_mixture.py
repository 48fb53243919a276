"""Training mixtures: corpora, synthetic tasks and short blocks; PoSE and document masking in a real run."""

from __future__ import annotations

import json

from _train_helpers import write_recipe

from ctxext.config import load_recipe
from ctxext.mixture import allocate
from ctxext.train import read_run, train


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
    assert run["status"] == "complete" and run["final_val_loss"] is not None
    mixture = json.loads((result.run_dir / "mixture.json").read_text())["realised"]
    assert mixture["rows"] == 4 and run["mixture"] == mixture
    short = [s for s in mixture["sources"] if s["source"].startswith("short:")]
    assert short and short[0]["rows"] == 2 and short[0]["block_tokens"] == 256
