"""Measured peak GPU memory of every GPU-only training path, against ``ctxext plan`` (run by scripts/gpu-check.sh).

A random Llama-3-8B-shaped model (the bundled published config, fewer layers: nothing is downloaded) is saved
once in bf16, then each path runs in a fresh process: ctxext's own training model (nf4 double-quant QLoRA, YaRN,
LoRA r=16 on every projection, embeddings and norms trained) and one optimizer step (forward, chunked loss,
backward, paged 8-bit AdamW) at ``--seq-len`` tokens, with the path's ``train.memory`` levers. Measured: the
allocator's peak (``torch.cuda.max_memory_allocated``) during the step; planned: the same recipe's plan on this
GPU less its overhead group (CUDA context, fragmentation: outside ``max_memory_allocated``). One line per path,
then the planner's terms below, a summary line, then one line for the sequence split's GPU tests and one for the full
fine-tune under FSDP2 and ZeRO-3; the format is in docs/planning.md.

The planner's terms that only a GPU can measure: the attention kernels' backward buffers (torch's SDPA and
flash-attn's, modelled from the kernels' source: ``ctxext/planner/layer.py``), and what one decoder layer saves
for its backward pass with the GPU's kernels (QLoRA with the bf16 stream, and a full fine-tune in bf16) against the
per-layer terms measured on the CPU with the same saved-tensor hooks.
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
    "tests/unit/training/test_sequence_parallel.py::test_ring_and_hybrid_splits_on_gpus_give_the_one_process_loss_and_gradients",
    "tests/unit/training/test_train_gpu.py::test_context_parallel_fsdp2",
    # The adaptive stop's best weights under FSDP2's DTensors (gathered whole, each shard put back).
    "tests/unit/training/test_train_gpu.py::test_probe_under_fsdp2_keeps_the_best_sharded_weights",
]
# A full fine-tune (train.mode: full: fp32 master weights and AdamW states, bf16 compute) launched with the shipped
# FSDP2 and DeepSpeed ZeRO-3 accelerate configs, against one unsharded process; runs on 1 GPU (one shard) or 2.
FULL_TESTS = ["tests/unit/training/test_train_gpu.py::test_full_fine_tune_sharded_trains_as_one_process"]
# The default recipe on the real checkpoint at its target (SmolLM2-135M, 32,768 tokens) with no memory flag: what
# `ctxext train` decides from the plan (train.gradient_checkpointing: auto) trains one step within the GPU.
FIT_TESTS = [
    "tests/integration/test_real_model.py::test_the_default_recipe_trains_the_real_checkpoint_at_its_target_on_one_gpu"
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


def tests_check(name: str, tests: list[str], gpus: int) -> tuple[str, bool]:
    """Run GPU-marked ``tests``; one line (ok, FAILED, or skipped on fewer than ``gpus`` GPUs), and whether they passed.

    Args:
        name: the line's label.
        tests: pytest node ids.
        gpus: the GPUs they need.
    """
    import torch

    count = torch.cuda.device_count()
    if count < gpus:
        return f"gpu-check | {name:<38} | skipped: needs {gpus} GPUs (one process each); this machine has {count}", True
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *tests]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    tail = (done.stdout.strip().splitlines() or ["?"])[-1][:200]
    return f"gpu-check | {name:<38} | {'ok' if done.returncode == 0 else 'FAILED'}: {tail}", done.returncode == 0


def attention_backward_check(attn: str, seq_len: int, device_type: str = "cuda", shape: dict | None = None) -> dict:
    """The attention kernel's backward memory beyond its inputs and dO, measured and planned (bytes).

    Llama-3-8B's attention (32 query heads, 8 key/value heads of 128) at ``seq_len`` tokens in bf16: measured is the
    allocator's peak during the backward less what was allocated before it (so dQ, dK, dV and the kernel's own
    buffers); planned is the planner's dQ, dK, dV plus, on CUDA, flash-attention's buffers.
    """
    import torch

    from ctxext.planner.footprint import ModelShape, Setup
    from ctxext.planner.layer import attention_backward, cpu_attention_backward_buffers, flash_backward_buffers

    heads, kv, dim = (shape or {}).get("heads", 32), (shape or {}).get("kv", 8), (shape or {}).get("dim", 128)
    device = torch.device(device_type)
    model = ModelShape(vocab=1, hidden=heads * dim, layers=1, heads=heads, kv_heads=kv, head_dim=dim, intermediate=1,
                       tied=False)  # fmt: skip
    setup = Setup(seq_len=seq_len, compute_bytes=2, residual_bytes=2, attention=attn, cuda=device_type == "cuda")
    q = torch.randn(1, seq_len, heads, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, seq_len, kv, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, seq_len, kv, dim, device=device, dtype=torch.bfloat16, requires_grad=True)
    if attn == "flash_attention_2":
        from flash_attn import flash_attn_func

        out = flash_attn_func(q, k, v, causal=True)
    else:
        sdpa = torch.nn.functional.scaled_dot_product_attention
        out = sdpa(*(x.transpose(1, 2) for x in (q, k, v)), is_causal=True, enable_gqa=kv != heads)
    grad = torch.randn_like(out)
    planned = sum(b for name, b in attention_backward(model, setup) if name.startswith("dQ"))
    if device_type == "cuda":
        planned += sum(b for _, b in flash_backward_buffers(model, setup))
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out.backward(grad)
        torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - before
    else:  # the CPU test of this script: the kernel runs, its peak is not the allocator's
        planned += cpu_attention_backward_buffers(model, setup)
        out.backward(grad)
        measured = planned
    return {"measured": measured, "planned": planned}


def saved_layer_check(folder: Path, full: bool, device_type: str = "cuda") -> dict:
    """What decoder layer 1 saves for the backward pass with this device's kernels, measured and planned (bytes).

    QLoRA (nf4, LoRA r=16 everywhere, embeddings and norms trained, bf16 stream) through ctxext's training path, or
    every weight trained in bf16 (a full fine-tune): one forward pass of 4,096 tokens under
    ``torch.autograd.graph.saved_tensors_hooks``, the distinct storages packed inside layer 1 less the parameters
    and the layer's input (``tests/unit/planner/test_plan_layer.py`` does the same on the CPU).
    """
    import torch

    from ctxext.models.build import load_weights
    from ctxext.models.sources import config_from_folder
    from ctxext.planner.footprint import ModelShape, Setup, layer_bytes
    from ctxext.planner.setup import shape_names
    from ctxext.recipe.memory import Levers
    from ctxext.recipe.sections import LoraSection
    from ctxext.training.model import add_lora

    tokens, device = 4096, torch.device(device_type)
    config = config_from_folder(folder)
    if full:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16, attn_implementation="sdpa")
        model = model.to(device).train().requires_grad_(True)
        decoder = model.model
    else:
        base = load_weights(folder, config, quantization="nf4", compute_dtype=torch.bfloat16, device=device)
        lora = LoraSection(r=16, alpha=32)
        model, _ = add_lora(base, lora, False, True, Levers(residual_dtype="bf16"))
        decoder = model.get_base_model().model
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    state = {"inside": False, "outside": set(params), "saved": {}}

    def enter(module: Any, args: Any, kwargs: Any) -> None:
        state["outside"].add(kwargs.get("hidden_states", args[0] if args else None).untyped_storage().data_ptr())
        state["inside"] = True

    decoder.layers[1].register_forward_pre_hook(enter, with_kwargs=True)
    decoder.layers[1].register_forward_hook(lambda *a: state.update(inside=False))

    def pack(t: Any) -> Any:
        ptr = t.untyped_storage().data_ptr()
        if not state["inside"]:
            state["outside"].add(ptr)
        elif ptr not in state["outside"]:
            state["saved"][ptr] = t.untyped_storage().nbytes()
        return t

    ids = torch.randint(0, config.vocab_size, (1, tokens), device=device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        decoder(input_ids=ids)
    setup = Setup(
        seq_len=tokens,
        quantization="none" if full else "nf4",
        residual_bytes=2,
        finetune="full" if full else "lora",
        lora_targets=() if full else shape_names(lora.target_modules, lora.extra_trainable)[0],
        extra_trainable=() if full else shape_names(lora.target_modules, lora.extra_trainable)[1],
        cuda=device_type == "cuda",
    )
    return {
        "measured": sum(state["saved"].values()),
        "planned": int(layer_bytes(ModelShape.from_config(config), setup)),
    }


def planner_term_checks(folder: Path, seq_len: int) -> list[str]:
    """One line per planner term measured on this GPU (attention backward buffers, a layer's saved tensors)."""
    import importlib.util

    lines, gib = [], 2**30
    checks: list[tuple[str, Any]] = [
        ("attention backward buffers (sdpa)", lambda: attention_backward_check("sdpa", seq_len))
    ]
    if importlib.util.find_spec("flash_attn"):
        checks.append(
            ("attention backward buffers (flash-attn)", lambda: attention_backward_check("flash_attention_2", seq_len))
        )
    checks += [
        ("layer 1 saved tensors, QLoRA bf16 stream", lambda: saved_layer_check(folder, full=False)),
        ("layer 1 saved tensors, full fine-tune bf16", lambda: saved_layer_check(folder, full=True)),
    ]
    for name, check in checks:
        try:
            r = check()
        except Exception as exc:  # one failed check must not hide the others' lines
            lines.append(
                f"gpu-check | {name:<42} | FAILED: {str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__}"
            )
            continue
        ratio = r["measured"] / r["planned"]
        ok = "ok" if abs(ratio - 1) <= TOLERANCE else "OFF-PLAN"
        lines.append(
            f"gpu-check | {name:<42} | measured {r['measured'] / gib:7.3f} GiB | planned {r['planned'] / gib:7.3f} GiB "
            f"| ratio {ratio:5.2f} {ok}"
        )
    return lines


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
        terms = planner_term_checks(Path(tmp), args.seq_len)
        for line in terms:
            print(line, flush=True)
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
    failed = any("FAILED" in line for line in terms)
    line, split_ok = tests_check("sequence split (ring, Ulysses, hybrid)", SPLIT_TESTS, 2)
    print(line, flush=True)
    line, full_ok = tests_check("full fine-tune (FSDP2, ZeRO-3)", FULL_TESTS, 1)
    print(line, flush=True)
    line, fit_ok = tests_check("default recipe on SmolLM2 at 32k (auto memory)", FIT_TESTS, 1)
    print(line, flush=True)
    return 0 if len(results) == len(names) and split_ok and full_ok and fit_ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
