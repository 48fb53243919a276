"""GPU-only training paths: paged 8-bit AdamW, bf16 compute, flash-attention choice, context parallelism, and a full
fine-tune sharded by FSDP2 or DeepSpeed ZeRO-3 (the shipped accelerate configs)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from ctxext.recipe.schema import load_recipe
from ctxext.training.run import read_run, train
from tests.helpers.train import ROOT, accelerate_cmd, free_port, run, write_full_recipe, write_recipe

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_cuda
def test_qlora_on_cuda_uses_bf16_and_paged_adamw(tmp_path, cache_root):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", tmp_path / "run", train={"max_steps": 3}))
    result = train(recipe)
    info = read_run(result.run_dir)
    assert info.compute_dtype == "bfloat16"
    assert info.attn_implementation in ("sdpa", "flash_attention_2")
    metrics = (result.run_dir / "metrics.jsonl").read_text()
    assert '"peak_mem_mb"' in metrics


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_context_parallel_fsdp2(tmp_path, cache_root):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        tmp_path / "run",
        quantization={"mode": "none"},
        model={"attn_implementation": "sdpa"},
        train={"max_steps": 2, "context_parallel_size": 2, "gradient_checkpointing": False},
    )
    cmd = accelerate_cmd(2, "train", str(recipe))
    cmd[cmd.index("--multi_gpu")] = "--use_fsdp"
    cmd[cmd.index("--use_fsdp") + 1 : cmd.index("--use_fsdp") + 1] = ["--fsdp_version", "2"]
    done = run(cmd, CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 0, done.stderr[-3000:]
    assert read_run(tmp_path / "run").status == "complete"


SDPA = {"attn_implementation": "sdpa"}


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize(("engine", "config"), [("fsdp2", "fsdp2.yaml"), ("zero3", "deepspeed_zero3.yaml")])
def test_full_fine_tune_sharded_trains_as_one_process(tmp_path, cache_root, engine, config):
    # fp32 master weights and AdamW states, bf16 compute; sharded over the GPUs there are (one process each, up to 2)
    # with the shipped accelerate config, it trains as one unsharded process (bf16 rounding: 2 % on the loss).
    from ctxext.models.load import load_model

    gpus = min(2, torch.cuda.device_count())
    one = train(load_recipe(write_full_recipe(tmp_path, "one", model=SDPA)))
    launcher = Path(sys.executable).with_name("accelerate")
    recipe = write_full_recipe(tmp_path, "sharded", model=SDPA, train={"micro_batch_size": 2 // gpus})
    cmd = [str(launcher), "launch", "--config_file", str(ROOT / "configs" / "accelerate" / config), "--num_processes",
           str(gpus), "--main_process_port", str(free_port()), "-m", "ctxext", "train", str(recipe)]  # fmt: skip
    done = run(cmd, timeout=600, CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 0, done.stderr[-3000:]
    info = read_run(tmp_path / "sharded")
    assert info.mode == "full" and info.compute_dtype == "bfloat16"
    assert info.topology is not None and info.topology.sharding == engine
    losses = [
        [json.loads(x)["loss"] for x in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        for d in ("one", "sharded")
    ]
    torch.testing.assert_close(losses[1], losses[0], rtol=2e-2, atol=0)
    assert one.run.final_val_loss == pytest.approx(info.final_val_loss, rel=2e-2)
    # The gathered model is a plain checkpoint: it loads with its patched RoPE.
    loaded = load_model(str(tmp_path / "sharded"))
    assert loaded.rope_check is not None and loaded.rope_check.ok and loaded.adapter_dir is None


@pytest.mark.gpu
@needs_cuda
def test_probe_under_fsdp2_keeps_the_best_sharded_weights(tmp_path, cache_root):
    # FSDP2 shards every weight (DTensors, even on one GPU): the probe gathers the best ones whole and puts each
    # process's shard back. Every probe reads 0 % on the untrained tiny model, so the best is step 1, trained at
    # learning rate 0 (one warmup step): its LoRA B matrices are zero, step 3's are not.
    from tests.helpers.train import adapter_tensors

    recipe = write_recipe(
        tmp_path / "r.yaml",
        tmp_path / "run",
        quantization={"mode": "none"},
        model={"attn_implementation": "sdpa"},
        train={
            "max_steps": 3,
            "gradient_checkpointing": False,
            "probe": {"trials": 8, "keys": 4, "interval": 1, "goal": 1.0, "patience": None},
        },
    )
    processes = min(2, torch.cuda.device_count())
    cmd = accelerate_cmd(processes, "train", str(recipe))
    cmd[cmd.index("--multi_gpu")] = "--use_fsdp"
    cmd[cmd.index("--use_fsdp") + 1 : cmd.index("--use_fsdp") + 1] = ["--fsdp_version", "2"]
    done = run(cmd, CTXEXT_CACHE=str(cache_root))
    assert done.returncode == 0, done.stderr[-3000:]
    info = read_run(tmp_path / "run")
    assert info.probe is not None and info.probe.stopped == "ceiling" and info.probe.best_step == 1
    assert [r["n"] for r in json.loads((tmp_path / "run" / "probe.json").read_text())["readings"]] == [8, 8, 8]
    written = adapter_tensors(tmp_path / "run")
    assert all(not written[k].any() for k in written if "lora_B" in k)
