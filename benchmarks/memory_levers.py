"""The CPU-measurable memory levers of ``train.memory``: peak resident memory, planned peak and tokens/s, one run.

A wide random Llama (hidden 2048, intermediate 6144, 2 layers, 32k vocabulary: the shape of
``benchmarks/train_memory.py``'s ``build_model``) through ctxext's own training path (nf4 double-quant, YaRN,
LoRA r=8 on every projection, gradient checkpointing, AdamW) at ``--length`` tokens (default 8,192). Six cells,
each in a fresh process (``benchmarks/_memory.py``): no tiling (transformers' own full-logit loss), the tiled
logits/loss (ctxext's chunked loss), the tiled MLP (``train.memory.tiled_mlp=true``) with the full-logit loss,
both; then bf16 compute (``quantization.compute_dtype: bfloat16``) with peft's fp32 residual stream and with
``train.memory.residual_dtype: bf16``, both with the tiled loss. Each cell: load, a 128-token warm-up step,
then one timed step (forward, backward, AdamW step). Measured: the process's peak resident set (``VmHWM``);
planned: ``ctxext plan`` for the same recipe against this machine's RAM; speed: tokens/s of the timed step and
its ratio to the first cell of the same run. Measurements are kept in ``benchmarks/results/memory_levers.json``
(a rerun measures only missing cells unless ``--remeasure``, and re-plans every cell).

Checkpoint offload needs pinned CUDA memory: ``scripts/gpu-check.sh`` measures it. Results:
``benchmarks/results/memory_levers.md``.

Usage::

    nice -n 10 python -m benchmarks.memory_levers                   # ~10+ minutes on a quiet 2-core machine
    python -m benchmarks.memory_levers --hidden 256 --length 1024   # a quick smoke run of the script itself
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

from benchmarks._common import measured_on
from benchmarks._memory import mem_total_gb, peak_rss_mb, run_watched, training_step

ROOT = Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "benchmarks" / "results" / "memory_levers.md"
RESULTS_JSON = RESULTS_MD.with_suffix(".json")
# name → (train.memory.tiled_mlp, loss, quantization.compute_dtype, train.memory.residual_dtype)
CELLS = {
    "untiled (full-logit loss)": (False, "full", "float32", "auto"),
    "tiled logits/loss (chunked)": (False, "chunked", "float32", "auto"),
    "tiled MLP, full-logit loss": (True, "full", "float32", "auto"),
    "tiled MLP + tiled loss": (True, "chunked", "float32", "auto"),
    # bf16 compute (nf4 matmuls and attention in bf16): peft's fp32 residual stream, then the bf16 stream.
    "bf16 compute, fp32 residual (peft), tiled loss": (False, "chunked", "bfloat16", "fp32"),
    "bf16 compute, bf16 residual, tiled loss": (False, "chunked", "bfloat16", "bf16"),
}


def model_dir(hidden: int) -> Path:
    """The random benchmark model of this width (built once by ``train_memory.build_model``)."""
    from benchmarks.train_memory import build_model
    from ctxext.models.builtin import cache_dir

    folder = cache_dir() / "benchmarks" / f"llama-v32000-h{hidden}-l2"
    if not (folder / "config.json").is_file():
        print(f"building {folder}…", flush=True)
        build_model(folder, 32000, hidden, 2, context=512)
    return folder


def recipe_for(folder: str, length: int, cell: str):
    """The recipe of one cell (the same for the measurement and the prediction)."""
    from ctxext.recipe.schema import parse_recipe

    tiled, _, dtype, residual = CELLS[cell]
    return parse_recipe(
        {
            "model": {"path": folder, "attn_implementation": "sdpa"},
            "rope": {"method": "yarn", "target_length": max(length, 1024)},
            "lora": {"r": 8, "alpha": 16, "extra_trainable": []},
            "quantization": {"compute_dtype": dtype},
            "data": {"path": "builtin:stdlib"},
            "train": {
                "seq_len": length,
                "optimizer": "adamw",
                "memory": {"tiled_mlp": tiled, "residual_dtype": residual},
                "seed": 0,
            },
        },
        source="benchmarks/memory_levers.py",
    )


def child(folder: str, length: int, cell: str) -> dict:
    """One cell in this process: load, warm up, one timed training step; peak resident set and speed."""
    import torch

    from ctxext.training.model import build_training_model

    loss = CELLS[cell][1]
    recipe = recipe_for(folder, length, cell)
    loaded = build_training_model(recipe)
    step = training_step(recipe, loaded, loss)
    vocab = loaded.model.get_base_model().config.vocab_size
    ids = torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(0))

    step(ids[:, :128])
    start = time.perf_counter()
    value = step(ids)
    seconds = time.perf_counter() - start
    return {"peak_mb": peak_rss_mb(), "seconds": seconds, "loss_value": value, "levers": loaded.levers}


def predict(folder: str, length: int, cell: str) -> float:
    """The planner's peak for one cell against this machine's RAM, MiB."""
    from ctxext.models.devices import cpu_device
    from ctxext.planner.plan import plan_recipe

    plan = plan_recipe(
        recipe_for(folder, length, cell), cpu_device(), loss=CELLS[cell][1], advise_changes=False, search=False
    )
    return plan.memory.total / 2**20


def main(argv: list[str] | None = None) -> None:
    """Measure every cell, one fresh process at a time, and write the table."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--length", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget-mb", type=float, default=mem_total_gb() * 1024 * 0.8)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--remeasure", action="store_true", help="measure cells already in the JSON again")
    parser.add_argument("--child", nargs=3, metavar=("FOLDER", "LENGTH", "CELL"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        folder, length, cell = args.child
        print(json.dumps(child(folder, int(length), cell)))
        return
    folder = str(model_dir(args.hidden))
    store = json.loads(RESULTS_JSON.read_text()) if RESULTS_JSON.is_file() else {}
    rows, base_speed = [], None
    for cell in CELLS:
        key = f"h{args.hidden}-t{args.length}-{cell}"
        if args.remeasure or not store.get(key, {}).get("ok"):
            cmd = [sys.executable, "-m", __spec__.name, "--child", folder, str(args.length), cell]
            store[key] = run_watched(cmd, args.threads, args.budget_mb, args.timeout)
            RESULTS_JSON.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
        result = store[key]
        planned = predict(folder, args.length, cell)
        if not result["ok"]:
            rows.append(f"| {cell} | {result['reason']} | {planned:,.0f} | | | |")
            print(f"{cell:32} {result['reason']}", flush=True)
            continue
        speed = args.length / result["seconds"]
        base_speed = base_speed or speed
        error = result["peak_mb"] / planned - 1
        rows.append(
            f"| {cell} | {result['peak_mb']:,.0f} | {planned:,.0f} | {error:+.0%} | {speed:,.0f} | "
            f"{speed / base_speed:.2f} | {result['loss_value']:.4f} |"
        )
        print(rows[-1], flush=True)
    flags = f"--hidden {args.hidden} --length {args.length} --threads {args.threads}"
    command = f"python -m benchmarks.memory_levers {flags}"
    text = "\n".join(
        [
            "# Memory levers on the CPU (`benchmarks/memory_levers.py`)",
            "",
            f"Command: `{command}` ({platform.processor() or platform.machine()}, {args.threads} threads, "
            f"{mem_total_gb():.0f} GiB RAM). Model: random Llama, hidden {args.hidden}, "
            f"intermediate {3 * args.hidden}, "
            f"2 layers, 32k vocabulary, nf4 + LoRA r=8, checkpointing, AdamW; {args.length:,} tokens; fp32 compute "
            "unless the cell says bf16. Speed ratio: to the first cell, same run. Error: measured / planned - 1.",
            "",
            measured_on(),
            "",
            "| cell | measured peak MiB | planned MiB | error | tokens/s | speed ratio | loss |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
            *rows,
            "",
        ]
    )
    RESULTS_MD.write_text(text)
    print(f"wrote {RESULTS_MD}")


if __name__ == "__main__":
    main()
