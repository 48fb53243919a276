"""Longest sequence ``builtin:grown-code-64`` can train on (one forward + backward) within a RAM budget.

Both sides load the model through ctxext's own code path: a recipe from :func:`ctxext.recipe.schema.parse_recipe`
(YaRN to the tested length, nf4 double-quant, LoRA r=16, gradient checkpointing, ``train.seq_len`` = length)
built by :func:`ctxext.training.model.build_training_model`. They differ only in the loss:

* **ctxext**: the training loop's :class:`ctxext.training.run.CausalLMWithChunkedLoss` (chunked cross-entropy over
  the last hidden states, logits never materialised at full length), ``total / n`` then backward.
* **plain**: ``model(input_ids=ids, labels=ids).loss`` then backward (transformers' full-length logits).

Each (side, length) runs in a fresh subprocess, so the peak resident set (``VmHWM``) is per length; the parent
also watches ``VmRSS`` and kills a run above the memory budget. Lengths double; a side stops at its first
failure (error, timeout, over budget), and a length is skipped when the time projected from the previous one
would overrun the compute budget.

Usage::

    nice -n 5 python -m benchmarks.max_length --lengths 4096 8192 16384 32768 65536
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._memory import mem_total_gb, run_watched, status_kb

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "max_length.md"
MODEL = "builtin:grown-code-64"
SIDES = ("ctxext", "plain")


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


def _recipe(length: int, out: str, chunk: int):
    from ctxext.recipe.schema import parse_recipe

    # The same recipe shape as `ctxext demo` (recipes/default.yaml), at the tested length.
    return parse_recipe(
        {
            "model": {"path": MODEL},
            "rope": {"method": "yarn", "target_length": length},
            "quantization": {"mode": "nf4", "double_quant": True},
            "lora": {"r": 16, "alpha": 32, "extra_trainable": ["embed_tokens", "norm"]},
            "data": {"path": "builtin:stdlib"},
            "train": {
                "seq_len": length,
                "micro_batch_size": 1,
                "max_steps": 1,
                "gradient_checkpointing": True,
                "loss_chunk_size": chunk,
                "seed": 0,
            },
            "output": {"dir": out},
        },
        source="benchmarks/max_length.py",
    )


def child(side: str, length: int, threads: int, chunk: int) -> dict:
    """One forward + backward at ``length`` tokens in this process; returns the measurements."""
    import torch

    torch.set_num_threads(threads)
    from ctxext.training.model import build_training_model
    from ctxext.training.run import CausalLMWithChunkedLoss, shifted_labels

    with tempfile.TemporaryDirectory() as tmp:
        recipe = _recipe(length, tmp, chunk)
        loaded = build_training_model(recipe)
    loaded_mb = status_kb("VmHWM") / 1024
    vocab = loaded.model.get_base_model().config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (1, recipe.train.seq_len), generator=gen)

    # One short untimed step first: the first call pays one-off costs (kernel and thread-pool set-up) that
    # would otherwise dominate s/step at short lengths. Its activations are freed before the timed step.
    short = ids[:, :128]
    if side == "ctxext":
        warm = CausalLMWithChunkedLoss(loaded.model, recipe.train.loss_chunk_size).train()
        total, n = warm(short, shifted_labels(short))
        (total / n).backward()
    else:
        loaded.model.train()(input_ids=short, labels=short).loss.backward()
    loaded.model.zero_grad(set_to_none=True)

    if side == "ctxext":
        # Exactly the training loop's loss: the wrapper's summed chunked loss over shifted labels, / tokens.
        model = CausalLMWithChunkedLoss(loaded.model, recipe.train.loss_chunk_size)
        model.train()
        start = time.perf_counter()
        total, n = model(ids, shifted_labels(ids))
        loss = total / n
    else:
        model = loaded.model
        model.train()
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    seconds = time.perf_counter() - start
    grads = sum(1 for p in model.parameters() if p.requires_grad and p.grad is not None)
    return {
        "side": side,
        "length": length,
        "loss": float(loss.detach()),
        "seconds": seconds,
        "peak_mb": status_kb("VmHWM") / 1024,
        "loaded_mb": loaded_mb,
        "params_with_grad": grads,
    }


def run_one(side: str, length: int, args: argparse.Namespace) -> dict:
    """Run :func:`child` in a fresh process, watching its memory and time."""
    cmd = [sys.executable, "-m", __spec__.name, "--child", side, str(length), "--threads", str(args.threads)]
    cmd += ["--chunk", str(args.chunk)]
    result = run_watched(cmd, args.threads, args.budget_mb, args.timeout)
    result.setdefault("side", side)
    result.setdefault("length", length)
    return result


def _cell(r: dict | None, key: str, fmt: str) -> str:
    if r is None:
        return "—"
    if not r["ok"]:
        return "fail" if key == "peak_mb" else "—"
    return format(r[key], fmt)


def table(results: dict[tuple[str, int], dict], lengths: list[int]) -> str:
    """The Markdown results table."""
    rows = [
        "| seq len | ctxext peak MB | plain peak MB | memory ratio ctxext/plain | ctxext s/step | plain s/step "
        "| ctxext tok/s | plain tok/s | notes |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for length in lengths:
        c, p = results.get(("ctxext", length)), results.get(("plain", length))
        if c is None and p is None:
            continue
        ratio = f"{c['peak_mb'] / p['peak_mb']:.2f}×" if c and p and c["ok"] and p["ok"] else "—"
        notes = "; ".join(f"{r['side']}: {r['reason']}" for r in (c, p) if r and not r["ok"])
        for r in (c, p):
            if r and r["ok"]:
                r["tok_s"] = r["length"] / r["seconds"]
        rows.append(
            f"| {length:,} | {_cell(c, 'peak_mb', ',.0f')} | {_cell(p, 'peak_mb', ',.0f')} | {ratio} "
            f"| {_cell(c, 'seconds', '.1f')} | {_cell(p, 'seconds', '.1f')} "
            f"| {_cell(c, 'tok_s', ',.0f')} | {_cell(p, 'tok_s', ',.0f')} | {notes} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    """Parse arguments; run the children (or be one)."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768, 65536])
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=256, help="loss_chunk_size (the demo's value)")
    parser.add_argument("--budget-mb", type=float, default=20 * 1024, help="kill a run above this RSS")
    parser.add_argument("--timeout", type=float, default=420, help="seconds per run")
    parser.add_argument("--compute-budget", type=float, default=1200, help="seconds for the whole benchmark")
    parser.add_argument("--child", nargs=2, metavar=("SIDE", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--no-write", action="store_true", help="do not write the results file")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.threads, args.chunk)))
        return

    started = time.monotonic()
    results: dict[tuple[str, int], dict] = {}
    stopped: dict[str, str] = {}
    last_wall: dict[str, tuple[int, float]] = {}
    for length in args.lengths:
        for side in args.sides:
            if side in stopped:
                continue
            if side in last_wall:
                # Attention is quadratic: project from the previous length to decide whether to try this one.
                prev_len, prev_wall = last_wall[side]
                projected = prev_wall * (length / prev_len) ** 2
                left = args.compute_budget - (time.monotonic() - started)
                if projected > min(left, args.timeout):
                    reason = f"skipped: projected {projected:.0f} s > {min(left, args.timeout):.0f} s left"
                    results[(side, length)] = {"side": side, "length": length, "ok": False, "reason": reason}
                    stopped[side] = reason
                    print(f"{side:6} {length:>6}: {reason}", flush=True)
                    continue
            r = run_one(side, length, args)
            results[(side, length)] = r
            if r["ok"]:
                last_wall[side] = (length, r["wall"])
                print(
                    f"{side:6} {length:>6}: peak {r['peak_mb']:,.0f} MB (loaded {r['loaded_mb']:,.0f} MB), "
                    f"{r['seconds']:.1f} s fwd+bwd, {length / r['seconds']:,.0f} tok/s, loss {r['loss']:.3f}, "
                    f"{r['params_with_grad']} grads, wall {r['wall']:.0f} s, sampled RSS"
                    f" peak {r['watched_mb']:,.0f} MB",
                    flush=True,
                )
            else:
                stopped[side] = r["reason"]
                print(f"{side:6} {length:>6}: FAILED ({r['reason']}), watched peak {r['peak_mb']:,.0f} MB", flush=True)
    text = table(results, args.lengths)
    print(text)
    longest = max((n for (s, n), r in results.items() if s == "ctxext" and r["ok"]), default=0)
    print(f"longest ctxext length: {longest:,} tokens; total {time.monotonic() - started:.0f} s")
    if args.no_write:
        return
    command = "nice -n 5 python -m benchmarks.max_length " + " ".join(sys.argv[1:] if argv is None else argv)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        "# Longest trainable sequence: grown-code-64 with ctxext vs. plain transformers loss\n\n"
        f"Command: `{command}`\n\n"
        f"Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Machine: {platform.machine()} CPU, "
        f"{os.cpu_count()} cores (shared with another benchmark), {args.threads} torch threads per run, "
        f"{mem_total_gb():.0f} GB RAM, no GPU; torch {_version('torch')}, transformers "
        f"{_version('transformers')}, peft {_version('peft')}, bitsandbytes {_version('bitsandbytes')}.\n\n"
        + f"Model: `{MODEL}` (4.2M-param Llama, 4 layers, hidden 256, vocab 2048, 64-token window), loaded by "
        "`ctxext.training.model.build_training_model` from a `parse_recipe` recipe: YaRN to the tested "
        "length, nf4 double-quant, LoRA r=16 α=32 (+ embed_tokens, norm trainable), gradient checkpointing, batch 1, "
        f"`train.seq_len` = length, loss_chunk_size {args.chunk}. One forward + backward on random token ids per "
        "cell, each in a fresh process. **ctxext** = the training loop's `CausalLMWithChunkedLoss` (chunked "
        "cross-entropy); **plain** = `model(input_ids, labels=input_ids).loss` (full-length logits). Peak MB is "
        "the process's VmHWM (imports + model included); s/step is the timed forward + backward only. "
        f"Memory budget {args.budget_mb / 1024:.0f} GB, per-run timeout {args.timeout:.0f} s, compute budget "
        f"{args.compute_budget:.0f} s (a length is skipped when the quadratic projection from the previous one "
        "would not fit).\n\n"
        f"{text}\n\nLongest length reached by ctxext: **{longest:,} tokens**.\n"
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
