"""Real multi-process runs on the CPU: 2-process DDP, two "nodes", the unsynchronised-launch guard, --resume.

End to end through ``accelerate launch`` / ``python -m ctxext`` (a separate process is the point of each),
so they are marked ``slow``: ``pytest -m "not slow"`` skips them in a quick loop; CI runs them.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest
import torch

from ctxext.errors import InputError
from ctxext.recipe.schema import load_recipe
from ctxext.training.run import read_run, train
from tests.helpers.train import (
    ROOT,
    accelerate_cmd,
    adapter_tensors,
    ctxext_cmd,
    env,
    free_port,
    head_shape_model,
    node_cmd,
    run,
    write_recipe,
)

pytestmark = pytest.mark.slow


def test_two_process_ddp_shards_batches_and_ends_identical(tmp_path, cache_root):
    # The shipped CPU recipe, launched exactly as its header says, made shorter with overrides.
    overrides = [
        f"output.dir={tmp_path / 'run'}",
        "train.max_steps=3",
        "train.seq_len=512",
        "data.max_documents=10",
        "data.validation_fraction=0.2",
        "train.eval_batches=1",
    ]
    done = run(
        accelerate_cmd(2, "train", "recipes/tiny-cpu.yaml", *overrides),
        ACCELERATE_USE_CPU="true",
        CTXEXT_CACHE=str(cache_root),
        CTXEXT_RANK_AUDIT=str(tmp_path / "ranks"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # Read from a file (no terminal): the main process's plain progress lines, once per step, and none of the
    # third-party noise ctxext hides (ctxext/cli/quiet.py).
    log = done.stdout + done.stderr
    assert [line.split(" · ")[0] for line in log.splitlines() if line.startswith("train: step")] == [
        "train: step 1/3 (33 %)",
        "train: step 2/3 (67 %)",
        "train: step 3/3 (100 %)",
    ], log
    assert "is_gradient_checkpointing" not in log and "gemm_4bit_forward" not in log and "Map" not in log, log
    assert "publisher trust check" not in log, log
    info = read_run(tmp_path / "run")
    assert info.num_processes == 2
    # Global batch: 2 processes x micro-batch 2 x 512 tokens per step.
    assert info.tokens_seen == 3 * 2 * 2 * 512
    ranks = [json.loads((tmp_path / "ranks" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    blocks = [r["blocks"] for r in ranks]
    # Each process trained on its own half: 3 steps x 2 blocks each, no block on both.
    assert len(blocks[0]) == len(blocks[1]) == 6
    assert not set(blocks[0]) & set(blocks[1])
    # Gradients were averaged: both processes hold exactly the same trained weights.
    assert ranks[0]["trainable_sha256"] == ranks[1]["trainable_sha256"]
    assert info.final_val_loss is not None


def test_two_nodes_splitting_a_one_kv_head_model_train_as_one_process(tmp_path, cache_root):
    # Two "machines" on this one: two accelerate launches, machine ranks 0 and 1, one process each, meeting at a
    # rendezvous on localhost (gloo), as docs/sequence-parallel.md gives for real nodes. Each row is split over the
    # two (train.sequence_parallel_size=2) on a model of 3 query heads and 1 key/value head, a shape only ctxext's
    # own Ulysses attention serves: the same per-step and validation losses as one process straight through.
    model = head_shape_model(tmp_path / "model", heads=3, kv_heads=1, head_dim=16)
    sections = {
        "model": {"path": str(model)},
        "data": {"max_documents": 20, "validation_fraction": 0.1},
        "train": {"max_steps": 3, "eval_batches": 1},
    }
    train(load_recipe(write_recipe(tmp_path / "a.yaml", tmp_path / "one", **sections)))
    recipe = write_recipe(tmp_path / "b.yaml", tmp_path / "two", **sections)
    port, launch_env = free_port(), env(ACCELERATE_USE_CPU="true", CTXEXT_CACHE=str(cache_root))
    nodes = [
        subprocess.Popen(
            node_cmd(node, 2, 2, port, "train", str(recipe), "train.sequence_parallel_size=2"),
            cwd=ROOT,
            env=launch_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for node in (0, 1)
    ]
    logs = [p.communicate(timeout=400)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], logs[0][-3000:] + logs[1][-3000:]
    one, two = read_run(tmp_path / "one"), read_run(tmp_path / "two")
    assert two.topology is not None and two.topology.model_dump() == {
        "world_size": 2,
        "nodes": 2,
        "processes_per_node": 1,
        "data_parallel": 1,
        "sequence_parallel": 2,
        "context_parallel": 1,
        "ulysses": "ctxext",
        "sharding": "ddp",
    }
    assert one.topology is not None and one.topology.world_size == 1 and two.tokens_seen == one.tokens_seen
    losses = [
        [json.loads(x)["loss"] for x in (d / "metrics.jsonl").read_text().splitlines()]
        for d in (tmp_path / "one", tmp_path / "two")
    ]
    assert len(losses[1]) == 3
    for a, b in zip(*losses, strict=True):
        assert abs(a - b) <= 1e-5 * a
    assert abs(one.final_val_loss - two.final_val_loss) <= 1e-5 * one.final_val_loss


def test_unsynchronised_launch_is_detected(tmp_path, cache_root):
    # --multi_gpu without CUDA and without ACCELERATE_USE_CPU starts two processes that accelerate
    # sees as two separate single-process jobs: each would train its own copy.
    recipe = write_recipe(tmp_path / "r.yaml", tmp_path / "run")
    done = run(accelerate_cmd(2, "train", str(recipe)), CTXEXT_CACHE=str(cache_root))
    assert done.returncode != 0
    assert "accelerate sees only one" in done.stderr and "ACCELERATE_USE_CPU=true" in done.stderr
    assert not (tmp_path / "run" / "run.json").exists()


def test_sigkill_then_resume_gives_the_uninterrupted_adapter(tmp_path, cache_root, capsys):
    # Only the killed run needs a process of its own; the straight and the resumed runs train in this one
    # (single-threaded, as the subprocess is: the adapters must agree to 1e-6).
    sections = {"train": {"max_steps": 6, "save_every": 2, "micro_batch_size": 1, "gradient_accumulation_steps": 2}}
    train(load_recipe(write_recipe(tmp_path / "a.yaml", tmp_path / "straight", **sections)))

    killed = write_recipe(tmp_path / "b.yaml", tmp_path / "killed", **sections)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    proc = subprocess.Popen(
        ctxext_cmd("train", str(killed)),
        cwd=ROOT,
        env=env(CTXEXT_CACHE=str(cache_root)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.time() + 240
        # Kill after step 3 is logged: the step-2 checkpoint exists, steps 4-6 are not done yet.
        while time.time() < deadline and proc.poll() is None:
            if metrics.exists() and any(json.loads(x)["step"] >= 3 for x in metrics.read_text().splitlines() if x):
                break
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    info = read_run(tmp_path / "killed", allow_incomplete=True)
    assert info.status == "running"  # a killed run never looks complete
    assert not (tmp_path / "killed" / "adapter_model.safetensors").exists()

    capsys.readouterr()
    train(load_recipe(killed), resume=True)
    assert "resumed from" in capsys.readouterr().out
    assert read_run(tmp_path / "killed").steps == 6
    a, b = adapter_tensors(tmp_path / "straight"), adapter_tensors(tmp_path / "killed")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], rtol=0, atol=1e-6, msg=name)
    steps = [json.loads(x)["step"] for x in (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4, 5, 6]  # metrics after the checkpoint were rewritten, not duplicated
    with pytest.raises(InputError, match="already complete"):
        train(load_recipe(killed), resume=True)
