"""GPU-only training paths: paged 8-bit AdamW, bf16 compute, flash-attention choice, context parallelism."""

from __future__ import annotations

import pytest
import torch
from _train_helpers import accelerate_cmd, run, write_recipe

from ctxext.recipe.schema import load_recipe
from ctxext.training.run import read_run, train

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
