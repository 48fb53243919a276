"""Measured peak GPU memory of every GPU-only training path, against ``ctxext plan`` (run by scripts/gpu-check.sh).

A random Llama-3-8B-shaped model (the bundled published config, fewer layers: nothing is downloaded) is saved
once in bf16, then each path runs in a fresh process: ctxext's own training model (nf4 double-quant QLoRA, YaRN,
LoRA r=16 on every projection, embeddings and norms trained) and one optimizer step (forward, chunked loss,
backward, paged 8-bit AdamW) at ``--seq-len`` tokens, with the path's ``train.memory`` levers. Measured: the
allocator's peak (``torch.cuda.max_memory_allocated``) during the step; planned: the same recipe's plan on this
GPU less its overhead group (CUDA context, fragmentation: outside ``max_memory_allocated``). One line per path,
then a summary line, then one line for the sequence split's GPU tests; the format is in docs/planning.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "ctxext" / "resources" / "hub-configs" / "meta-llama--Meta-Llama-3-8B"
TOKENIZER = ROOT / "ctxext" / "resources" / "grown-code-64"
OFF = {"residual_dtype": "fp32", "offload_checkpoints": False, "tiled_mlp": False, "expandable_segments": False}
# name → (train.memory, model.attn_implementation); "flash" only where flash-attn is installed.
PATHS: dict[str, tuple[dict[str, Any], str]] = {
    "sdpa, no levers (peft's fp32 stream)": (OFF, "sdpa"),
    "flash-attn, no levers": (OFF, "flash_attention_2"),
    "bf16 residual stream": ({**OFF, "residual_dtype": "bf16"}, "sdpa"),
    "checkpoint offload": ({**OFF, "offload_checkpoints": True}, "sdpa"),
    "tiled MLP": ({**OFF, "tiled_mlp": True}, "sdpa"),
    "all levers (train.memory defaults)": ({}, "sdpa"),
}
TOLERANCE = 0.25
# The sequence split's GPU-only paths, checked for exactness against one process by their tests (marked gpu): torch's
# ring (context parallelism) alone and under FSDP2, ctxext's own Ulysses attention over NCCL, and with 4 GPUs the
# hybrid of the two. One process per GPU: on fewer than 2 GPUs they cannot run.
SPLIT_TESTS = [
    "tests/test_sequence_parallel.py::test_ring_and_hybrid_splits_on_gpus_give_the_one_process_loss_and_gradients",
    "tests/test_train_gpu.py::test_context_parallel_fsdp2",
]


def save_model(folder: Path, layers: int, device: str = "cuda", shape: dict[str, int] | None = None) -> None:
    """A random Llama-3-8B-shaped model with ``layers`` layers, in bf16, with a tokenizer (no download).

    ``shape`` overrides config sizes (the CPU test of this script uses a tiny one).
    """
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM

    config = AutoConfig.from_pretrained(CONFIG)
    config.num_hidden_layers = layers
    for key, value in (shape or {}).items():
        setattr(config, key, value)
    torch.manual_seed(0)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(TOKENIZER).save_pretrained(folder)
    del model
    torch.cuda.empty_cache()


def run_path(
    layers: int = 2,
    seq_len: int = 8192,
    memory: dict[str, Any] | None = None,
    attn: str = "sdpa",
    folder: Path | None = None,
    device_type: str = "cuda",
    shape: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One training step of one path in this process; returns measured and planned peaks (bytes) and the levers.

    ``device_type="cpu"`` with a tiny ``shape`` runs the same code on the CPU (measured: the peak resident set), so
    that a test can check this script where there is no GPU.
    """
    import resource

    import torch

    from ctxext.models.devices import Device, cpu_device
    from ctxext.planner.fit import device_footprint
    from ctxext.planner.footprint import ModelShape
    from ctxext.planner.plan import setup_for
    from ctxext.recipe.schema import parse_recipe
    from ctxext.training.model import build_training_model
    from ctxext.training.steps import CausalLMWithChunkedLoss, make_optimizer

    if folder is None:
        folder = Path(tempfile.mkdtemp(prefix="ctxext-gpu-check-"))
        save_model(folder, layers, device_type, shape)
    recipe = parse_recipe(
        {
            "model": {"path": str(folder), "attn_implementation": attn},
            "rope": {"method": "yarn", "target_length": max(seq_len, 16384)},
            "lora": {"r": 16, "alpha": 32},
            "data": {"path": "unused"},
            "train": {"seq_len": seq_len, "memory": memory or {}},
        }
    )
    device = torch.device(device_type)
    cuda = device.type == "cuda"
    loaded = build_training_model(recipe, device)
    model = CausalLMWithChunkedLoss(loaded.model, recipe.train.loss_chunk_size)
    optimizer, _ = make_optimizer(recipe, [p for p in model.parameters() if p.requires_grad], device)
    ids = torch.randint(0, loaded.model.config.vocab_size, (1, seq_len), device=device)
    labels = torch.cat([ids[:, 1:], torch.full_like(ids[:, :1], -100)], dim=1)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    total, count = model(ids, labels)
    (total / count).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    if cuda:
        props = torch.cuda.get_device_properties(0)
        target = Device(name=props.name, memory=int(props.total_memory), tflops=None, kind="cuda")
        measured, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    else:
        target = cpu_device()
        measured = reserved = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    setup = setup_for(recipe, target, 1, None)
    fp = device_footprint(ModelShape.from_config(loaded.model.config), setup, target)
    return {
        "measured": measured,
        "reserved": reserved,
        "planned": fp.total - sum(c.bytes for c in fp.components if c.group == "overhead"),
        "levers": loaded.levers,
        "attn": loaded.attn_implementation,
        "tokens_per_s": seq_len / seconds,
    }


def _line(name: str, r: dict[str, Any]) -> str:
    ratio = r["measured"] / r["planned"]
    ok = "ok" if abs(ratio - 1) <= TOLERANCE else "OFF-PLAN"
    gib = 2**30
    return (
        f"gpu-check | {name:<38} | measured {r['measured'] / gib:7.2f} GiB (reserved {r['reserved'] / gib:7.2f}) | "
        f"planned {r['planned'] / gib:7.2f} GiB | ratio {ratio:5.2f} {ok} | {r['tokens_per_s']:,.0f} tok/s | "
        f"{r['attn']} {json.dumps(r['levers'], separators=(',', ':'))}"
    )


def split_check() -> tuple[str, bool]:
    """Run :data:`SPLIT_TESTS`; one line (ok, FAILED, or skipped on fewer than 2 GPUs) and whether it did not fail."""
    import torch

    name = "sequence split (ring, Ulysses, hybrid)"
    count = torch.cuda.device_count()
    if count < 2:
        return f"gpu-check | {name:<38} | skipped: needs 2 GPUs (one process each); this machine has {count}", True
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *SPLIT_TESTS]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tail = (done.stdout.strip().splitlines() or ["?"])[-1][:200]
    return f"gpu-check | {name:<38} | {'ok' if done.returncode == 0 else 'FAILED'}: {tail}", done.returncode == 0


def main() -> int:
    """Run every path in a fresh process and print one line each, then the summary."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=int(os.environ.get("GPU_CHECK_LAYERS", 4)))
    parser.add_argument("--seq-len", type=int, default=int(os.environ.get("GPU_CHECK_SEQ_LEN", 32768)))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: run one path, print its JSON
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("gpu-check: needs a CUDA GPU (torch sees none); nothing was run", file=sys.stderr)
        return 2
    if args.one:
        memory, attn = PATHS[args.one]
        result = run_path(args.layers, args.seq_len, memory, attn, Path(args.folder))
        print(json.dumps(result))
        return 0
    import importlib.util

    names = [n for n in PATHS if PATHS[n][1] != "flash_attention_2" or importlib.util.find_spec("flash_attn")]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="ctxext-gpu-check-") as tmp:
        save_model(Path(tmp), args.layers)
        print(
            f"gpu-check: {torch.cuda.get_device_name(0)}, Llama-3-8B shape with {args.layers} layers, "
            f"{args.seq_len:,} tokens, nf4 QLoRA, paged 8-bit AdamW",
            flush=True,
        )
        for name in names:
            cmd = [sys.executable, __file__, "--one", name, "--folder", tmp, "--layers", str(args.layers),
                   "--seq-len", str(args.seq_len)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                tail = (done.stderr.strip().splitlines() or ["?"])[-1][:200]
                print(f"gpu-check | {name:<38} | FAILED: {tail}", flush=True)
                continue
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
            print(_line(name, results[name]), flush=True)
    within = sum(abs(r["measured"] / r["planned"] - 1) <= TOLERANCE for r in results.values())
    base = results.get(names[0])
    # A path agrees with the plan when its measured peak moves from the no-lever path's the way its plan does.
    agree = [
        n
        for n in names[1:]
        if base
        and n in results
        and (results[n]["measured"] - base["measured"]) * (results[n]["planned"] - base["planned"]) > 0
    ]
    print(
        f"gpu-check summary: {len(results)} of {len(names)} paths ran; {within} within ±{TOLERANCE:.0%} of the plan; "
        f"{len(agree)} of {len(names) - 1} move the measured peak from the no-lever path's the way the plan says"
    )
    line, split_ok = split_check()
    print(line, flush=True)
    return 0 if len(results) == len(names) and split_ok else 1


if __name__ == "__main__":
    sys.exit(main())
