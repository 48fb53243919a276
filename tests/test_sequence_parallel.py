"""Sequence parallelism (``train.sequence_parallel_size``, DeepSpeed Ulysses) on the CPU over gloo.

The 2-process tests launch the way users launch (``accelerate launch --multi_gpu --num_processes 2`` with
``ACCELERATE_USE_CPU=true``) and compare with one process: the loss within 1e-6 and every trainable gradient within
1e-5 (relative) on 2,048-token rows, and the adapter after five optimizer steps of ``ctxext train``.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch
from _train_helpers import ROOT, accelerate_cmd, adapter_tensors, ctxext_cmd, run, write_recipe

from ctxext.errors import CtxextError, InputError
from ctxext.recipe.schema import RecipeError, load_recipe
from ctxext.training.data.rows import IGNORE_INDEX, ModelInputs, build_inputs
from ctxext.training.sequence_parallel import SequenceSplit, check_heads, check_sequence_parallel

deepspeed_missing = pytest.mark.skipif(
    __import__("importlib").util.find_spec("deepspeed") is None,
    reason="needs deepspeed (pip install 'ctxext[deepspeed]')",
)
# The tiny Llama (4 heads, 2 key/value heads) at 2,048 tokens, 8x its window, with YaRN.
SPLIT = {
    "rope": {"method": "yarn", "target_length": 4096},
    "train": {"seq_len": 2048, "micro_batch_size": 2, "loss_chunk_size": 512},
}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / a.norm())


# ---- the shard: padding, positions, refusals (no processes needed) ----


def test_shards_pad_to_a_multiple_and_keep_global_positions():
    ids = torch.arange(14).reshape(2, 7) + 100
    inputs = build_inputs({"input_ids": ids}, attn_implementation="sdpa", target_length=64, pose_chunks=2, seed=3)
    shards = [SequenceSplit(size=3, rank=r).shard(inputs) for r in range(3)]
    assert all(s.input_ids.shape == (2, 3) for s in shards)  # 7 tokens padded to 9, 3 per process
    joined = ModelInputs(
        *(torch.cat([getattr(s, k) for s in shards], dim=1) for k in ("input_ids", "labels", "position_ids"))
    )
    assert torch.equal(joined.input_ids[:, :7], ids) and torch.equal(joined.labels[:, :7], inputs.labels)
    assert (joined.labels[:, 7:] == IGNORE_INDEX).all()  # padding is never scored
    # PoSE positions pass unchanged; padding continues them, so the gathered row stays one causal sequence.
    assert torch.equal(joined.position_ids[:, :7], inputs.position_ids)
    assert torch.equal(joined.position_ids[:, 7:], inputs.position_ids[:, -1:] + torch.tensor([1, 2]))
    assert all(s.attention_mask.shape == (2, 3) and s.attention_mask.all() for s in shards)


def test_plain_rows_get_their_positions_and_no_split_changes_nothing():
    ids = torch.arange(8).reshape(1, 8)
    inputs = build_inputs({"input_ids": ids}, attn_implementation="sdpa")
    assert inputs.position_ids is None
    assert SequenceSplit().shard(inputs) is inputs
    assert torch.equal(SequenceSplit(size=2, rank=1).shard(inputs).position_ids, torch.arange(4, 8).reshape(1, 4))


def test_rows_of_several_documents_are_refused():
    rows = {"input_ids": torch.arange(8).reshape(1, 8), "segments": torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1]])}
    inputs = build_inputs(rows, attn_implementation="sdpa")
    with pytest.raises(CtxextError, match="train.sequence_parallel_size: a row holds several documents"):
        SequenceSplit(size=2, rank=0).shard(inputs)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("rope.method=dynamic", "rope.method 'dynamic'"),
        ("rope.method=longrope", "rope.method 'longrope'"),
        ("data.document_mask=true", "data.document_mask"),
        ("data.short_fraction=0.3", "data.short_fraction"),
        ("model.attn_implementation=eager", "eager"),
        ("train.context_parallel_size=2", "train.context_parallel_size"),
    ],
)
def test_recipes_the_split_cannot_serve_are_refused(tmp_path, override, says):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **SPLIT)
    with pytest.raises(RecipeError) as err:
        load_recipe(recipe, ["train.sequence_parallel_size=2", override])
    [(key, message)] = err.value.problems
    assert key == "train.sequence_parallel_size" and says in message


def test_task_rows_are_refused(tmp_path):
    mixture = [{"path": "builtin:stdlib", "weight": 1}, {"task": "passkey", "weight": 1}]
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", data={"path": None, "mixture": mixture}, **SPLIT)
    with pytest.raises(RecipeError, match="task sources in data.mixture"):
        load_recipe(recipe, ["train.sequence_parallel_size=2"])


def test_heads_and_launch_size_are_checked(cache_root):
    from transformers import AutoConfig

    from ctxext.models.sources import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path("builtin:tiny-llama"))
    check_heads(config, 2)  # 4 heads, 2 key/value heads
    with pytest.raises(
        InputError, match=r"train.sequence_parallel_size: 4 must divide .* heads \(4\) and key/value heads \(2\)"
    ):
        check_heads(config, 4)
    with pytest.raises(InputError, match=r"2 does not divide the 3 process\(es\)"):
        check_sequence_parallel(2, 3)
    check_sequence_parallel(2, 4)


@pytest.mark.slow
def test_cli_refuses_a_split_it_cannot_make_and_writes_nothing(tmp_path, cache_root):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **SPLIT)
    # One process cannot hold a split of 2.
    done = run(ctxext_cmd("train", str(recipe), "train.sequence_parallel_size=2"), CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "train.sequence_parallel_size: 2 does not divide the 1 process(es)" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "run").exists()
    # Without DeepSpeed (None in sys.modules: Python's own "not importable"), the message names the extra.
    argv = ["ctxext", "train", str(recipe), "train.sequence_parallel_size=2"]
    code = f"import runpy, sys; sys.modules['deepspeed'] = None; sys.argv = {argv!r}; runpy.run_module('ctxext')"
    done = run([sys.executable, "-c", code], CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "train.sequence_parallel_size: 2 needs DeepSpeed" in done.stderr and "ctxext[deepspeed]" in done.stderr
    assert not (tmp_path / "run").exists()


# ---- two real processes over gloo ----


@pytest.mark.slow
@deepspeed_missing
def test_two_process_split_gives_the_one_process_loss_and_gradients(tmp_path, cache_root):
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run", **SPLIT)
    split = write_recipe(
        tmp_path / "s.yaml", tmp_path / "run", **{**SPLIT, "train": {**SPLIT["train"], "sequence_parallel_size": 2}}
    )
    cases = "plain,pose,ignored"
    worker = str(ROOT / "tests" / "_sp_worker.py")
    one = run([sys.executable, worker, str(recipe), str(tmp_path / "one.pt"), cases], CTXEXT_CACHE=str(cache_root))
    assert one.returncode == 0, one.stderr[-3000:]
    cmd = accelerate_cmd(2, str(split), str(tmp_path / "two.pt"), cases)
    cmd[cmd.index("-m") : cmd.index("ctxext") + 1] = [worker]  # a script, not `-m ctxext`
    two = run(cmd, ACCELERATE_USE_CPU="true", CTXEXT_CACHE=str(cache_root))
    assert two.returncode == 0, two.stderr[-3000:]
    a, b = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert (a["processes"], b["processes"]) == (1, 2)
    for case in cases.split(","):
        ref, got = a["cases"][case], b["cases"][case]
        assert torch.isfinite(torch.tensor(got["loss"]))
        assert abs(got["loss"] - ref["loss"]) <= 1e-6 * abs(ref["loss"]), case
        assert ref["grads"].keys() == got["grads"].keys()
        for name, grad in ref["grads"].items():
            assert grad.norm() > 0, name  # every gradient is exercised (LoRA B starts non-zero in the worker)
            assert _relative(grad, got["grads"][name]) <= 1e-5, (case, name)


@pytest.mark.slow
@deepspeed_missing
def test_two_process_ctxext_train_ends_with_the_one_process_adapter(tmp_path, cache_root):
    from ctxext.training.run import read_run, train

    sections = {
        **SPLIT,
        "data": {"max_documents": 40, "validation_fraction": 0.1},
        "train": {**SPLIT["train"], "max_steps": 5, "eval_batches": 1},
    }
    train(load_recipe(write_recipe(tmp_path / "a.yaml", tmp_path / "one", **sections)))
    recipe = write_recipe(tmp_path / "b.yaml", tmp_path / "two", **sections)
    done = run(
        accelerate_cmd(2, "train", str(recipe), "train.sequence_parallel_size=2"),
        ACCELERATE_USE_CPU="true",
        CTXEXT_CACHE=str(cache_root),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = read_run(tmp_path / "one"), read_run(tmp_path / "two")
    assert two["num_processes"] == 2 and two["tokens_seen"] == one["tokens_seen"] == 5 * 2 * 2048
    losses = [
        [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (tmp_path / "one", tmp_path / "two")
    ]
    assert len(losses[1]) == 5
    for a, b in zip(*losses, strict=True):
        assert abs(a - b) <= 1e-5 * a
    assert abs(one["final_val_loss"] - two["final_val_loss"]) <= 1e-5 * one["final_val_loss"]
    a, b = adapter_tensors(tmp_path / "one"), adapter_tensors(tmp_path / "two")
    assert a.keys() == b.keys()
    for name in a:
        assert _relative(a[name], b[name]) <= 1e-4, name
