"""Sequence parallelism (``train.sequence_parallel_size``): one process vs N = 2 over gloo, measured.

Per-rank peak memory, activation memory (peak − the after-warm-up baseline) and tokens/s of one training step
(forward, backward, AdamW) for one process and for two processes splitting the row with DeepSpeed Ulysses, on
``builtin:grown-code-64-mk`` (nf4) and on a wide random Llama (hidden 1024, 8 heads, 2 layers, fp32, nf4 off);
the longest length that trains under the one-process peak as a per-process cap; and the planner's per-rank
prediction (``ctxext plan --sp N`` on this CPU) next to every measured cell. :data:`PROTOCOL` says exactly how;
it is printed on the result page, ``benchmarks/results/sequence_parallel.md``.

Usage::

    nice -n 5 python -m benchmarks.sequence_parallel --length 8192 --repeats 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._memory import mem_total_gb, status_kb

ROOT = Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "benchmarks" / "results" / "sequence_parallel.md"
MODELS = ("grown", "wide")
TOLERANCE = 0.20
TARGET_ACTIVATION = 0.6
TARGET_LONGEST = 1.8


# ---- the models and recipes (shared by the measurement and the prediction) ----


def wide_model_dir() -> Path:
    """The wide random Llama (hidden 1024, 8 heads, 2 layers), built once into ctxext's cache."""
    from ctxext.models.builtin import cache_dir

    folder = cache_dir() / "benchmarks" / "llama-sp-h1024-l2"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from ctxext.models.sources import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("builtin:grown-code-64-mk"))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=1024,
        intermediate_size=2752,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    print(f"building {folder}…", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def recipe_for(model: str, length: int, n: int, model_dir: str | None = None):
    """The recipe of one cell: ``model`` at ``length`` tokens over ``n`` processes."""
    from ctxext.recipe.schema import parse_recipe

    path = "builtin:grown-code-64-mk" if model == "grown" else model_dir or str(wide_model_dir())
    return parse_recipe(
        {
            "model": {"path": path, "attn_implementation": "sdpa"},
            "rope": {"method": "yarn", "target_length": length},
            "quantization": {"mode": "nf4", "double_quant": True} if model == "grown" else {"mode": "none"},
            "lora": {"r": 8, "alpha": 16, "extra_trainable": []},
            "data": {"path": "builtin:stdlib"},
            "train": {
                "seq_len": length,
                "micro_batch_size": 1,
                "max_steps": 1,
                "optimizer": "adamw",
                "gradient_checkpointing": True,
                "loss_chunk_size": 1024,
                "sequence_parallel_size": n,
                "seed": 0,
            },
            "output": {"dir": "unused"},
        },
        source="benchmarks/sequence_parallel.py",
    )


# ---- one rank of one cell (run under the launcher) ----


def reset_peak() -> None:
    """Reset this process's resident high-water mark (``VmHWM``) to its current resident set (Linux ≥ 4.0)."""
    Path("/proc/self/clear_refs").write_text("5")


def worker(model: str, length: int, repeats: int, out: str, model_dir: str, threads: int) -> None:
    """One rank: load, start the split, warm up, then ``repeats`` timed steps; write this rank's JSON."""
    import torch

    torch.set_num_threads(threads)
    from ctxext.training.data.rows import build_inputs
    from ctxext.training.launch import start_accelerator
    from ctxext.training.losses import micro_batch_loss
    from ctxext.training.model import build_training_model
    from ctxext.training.sequence_parallel import start_sequence_parallel
    from ctxext.training.steps import CausalLMWithChunkedLoss, make_optimizer

    n = int(os.environ.get("WORLD_SIZE", "1") or 1)
    recipe = recipe_for(model, length, n, model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        acc = start_accelerator(recipe, Path(tmp)).accelerator
    torch.manual_seed(0)
    loaded = build_training_model(recipe, acc.device)
    split = start_sequence_parallel(n, loaded.model, loaded.attn_implementation, 1)
    wrapper = CausalLMWithChunkedLoss(loaded.model, recipe.train.loss_chunk_size).train()
    optimizer, _ = make_optimizer(recipe, [p for p in wrapper.parameters() if p.requires_grad], acc.device)
    prepared = acc.prepare(wrapper)
    vocab = loaded.model.get_base_model().config.vocab_size

    def step(tokens: int, seed: int) -> tuple[float, float]:
        ids = torch.randint(3, vocab, (1, tokens), generator=torch.Generator().manual_seed(seed))
        inputs = split.shard(build_inputs({"input_ids": ids}, attn_implementation=loaded.attn_implementation))
        acc.wait_for_everyone()
        start = time.perf_counter()
        total, _ = prepared(inputs.input_ids, inputs.labels, inputs.position_ids, inputs.attention_mask)
        loss = micro_batch_loss(total, inputs.labels, 1)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        acc.wait_for_everyone()
        return time.perf_counter() - start, float(acc.reduce(loss.detach(), "sum"))

    step(256, 0)  # allocates the optimizer state, gloo's buffers and DeepSpeed's lazily built pieces
    gc.collect()
    load_peak = status_kb("VmHWM") / 1024
    reset_peak()
    baseline = status_kb("VmRSS") / 1024
    runs, peaks = [], []
    for i in range(repeats):
        reset_peak()  # to the resident set now: each step's own high-water mark
        runs.append(step(length, 1 + i))
        peaks.append(status_kb("VmHWM") / 1024)
    result = {
        "rank": acc.process_index,
        "processes": acc.num_processes,
        "load_peak_mb": load_peak,
        "baseline_mb": baseline,
        "peaks_mb": peaks,
        "seconds": [s for s, _ in runs],
        "loss": runs[-1][1],
    }
    Path(f"{out}.rank{acc.process_index}.json").write_text(json.dumps(result))
    acc.wait_for_everyone()


# ---- the parent: launch cells, search the longest length, predict, report ----


def launch_cell(args: argparse.Namespace, model: str, length: int, n: int, repeats: int, live: bool) -> dict:
    """Run one cell in fresh processes (1 plain, or ``n`` under accelerate); the per-rank results."""
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "cell")
        # `python -m` / `accelerate launch --module`: the worker imports the benchmarks package as the parent does.
        worker_args = [__spec__.name, "--worker", model, str(length), str(repeats), out]
        worker_args += ["--model-dir", str(wide_model_dir()), "--threads", str(args.threads)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS=str(args.threads), TOKENIZERS_PARALLELISM="false")
        env.pop("WORLD_SIZE", None)
        if n == 1:
            cmd = [sys.executable, "-m", *worker_args]
        else:
            launcher = str(Path(sys.executable).with_name("accelerate"))
            port = str(29500 + os.getpid() % 1000)
            cmd = [launcher, "launch", "--multi_gpu", "--num_processes", str(n), "--num_machines", "1"]
            cmd += [
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                "--main_process_port",
                port,
                "--module",
                *worker_args,
            ]
            env["ACCELERATE_USE_CPU"] = "true"
        if live:
            env.update(LIVE)
        start = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"ok": False, "reason": f"timeout {args.timeout:.0f} s"}
        ranks = sorted(Path(tmp).glob("cell.rank*.json"))
        if done.returncode != 0 or len(ranks) != n:
            last = (done.stderr.strip().splitlines() or ["?"])[-1]
            return {"ok": False, "reason": f"exit {done.returncode}: {last[:200]}"}
        results = [json.loads(p.read_text()) for p in ranks]
    return {"ok": True, "wall": time.monotonic() - start, "ranks": results}


# glibc: every allocation above 64 KiB mmap'd, and so returned to the OS when freed: the resident peak is then the
# live peak. With the default allocator, whether a 32 MB tensor (8k tokens × hidden 1024 × fp32, glibc's largest
# dynamic mmap threshold) is mmap'd or carved from the heap depends on what was freed before, so the peaks of the
# wide model wander by hundreds of MB from launch to launch.
LIVE = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def cell_key(model: str, length: int, n: int, live: bool = False) -> str:
    """The JSON key of one cell (``/live``: measured with :data:`LIVE`)."""
    return f"{model}/{length}/n{n}" + ("/live" if live else "")


def measured(args: argparse.Namespace, store: dict, cell: tuple[str, int, int, bool], repeats: int) -> dict:
    """A cell ``(model, length, n, live)`` from the store, or measured now (and saved at once).

    Only cells of this run's allocator mode (``--force-mmap`` or not) are measured; the other mode's are read.
    """
    key = cell_key(*cell)
    if cell[3] != args.force_mmap:
        return store.get(key, {"ok": False, "reason": "not measured"})
    if not (store.get(key, {}).get("ok") and not args.remeasure) and key not in args.fresh:
        store[key] = launch_cell(args, *cell[:3], repeats, cell[3])
        args.fresh.add(key)
        args.out.with_suffix(".json").write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    result = store[key]
    shown = f"peak {peak_of(result):,.0f} MB/rank in {result['wall']:.0f} s" if result["ok"] else result["reason"]
    print(f"{key:22} {shown}", flush=True)
    return result


def peak_of(cell: dict, first: bool = False) -> float:
    """The largest per-rank peak of a cell (MiB), over all its steps or over its first step only."""
    return max(max(r["peaks_mb"][:1] if first else r["peaks_mb"]) for r in cell["ranks"])


def activation_of(cell: dict) -> float:
    """The largest per-rank activation memory of a cell (peak − baseline, MiB)."""
    return max(max(r["peaks_mb"]) - r["baseline_mb"] for r in cell["ranks"])


def longest_under(args: argparse.Namespace, store: dict, model: str, n: int, cap: float, live: bool) -> dict:
    """The longest multiple of ``--step`` tokens whose per-rank peak stays ≤ ``cap`` with ``n`` processes.

    Starts from the linear estimate of the cell at ``--length`` (baseline + activation × L / length) and walks
    one step at a time until a fitting length sits next to a failing one.
    """
    step = args.step
    ref = measured(args, store, (model, args.length, n, live), args.repeats)
    if not ref["ok"]:
        return {"longest": None, "trials": []}
    base = max(r["baseline_mb"] for r in ref["ranks"])
    guess = int(args.length * (cap - base) / max(activation_of(ref), 1.0)) // step * step
    fits: dict[int, bool] = {args.length: peak_of(ref, first=True) <= cap}
    length = max(step, min(guess, args.max_length))
    for _ in range(args.max_trials):
        if length not in fits:
            cell = measured(args, store, (model, length, n, live), 1)
            if not cell["ok"] and cell["reason"] == "not measured":
                # The other allocator mode's search, read back only as far as it was measured: no result.
                return {"longest": None, "trials": sorted(fits.items())}
            fits[length] = bool(cell["ok"]) and peak_of(cell, first=True) <= cap
        best = max((k for k, v in fits.items() if v), default=0)
        failed = min((k for k, v in fits.items() if not v and k > best), default=None)
        if not best or failed == best + step or best + step > args.max_length:
            break
        # Down from the nearest failure, else up from the best fit: the boundary is between them.
        length = failed - step if failed else best + step
    best = max((k for k, v in fits.items() if v), default=None)
    return {"longest": best, "trials": sorted(fits.items())}


def predict(model: str, length: int, n: int, live: bool = False) -> tuple[float, float]:
    """The planner's per-rank prediction for a cell: total peak and its activation share (MiB).

    ``live``: without the planner's malloc-retention term (what a forced-mmap measurement sees).
    """
    from ctxext.models.devices import cpu_device
    from ctxext.planner.plan import CPU_RUNTIME, plan_recipe

    plan = plan_recipe(recipe_for(model, length, n), cpu_device(), num_gpus=n, advise_changes=False, search=False)
    memory = plan.memory
    state = sum(c.bytes for c in memory.components if c.group in ("weights", "trainable") and "step" in c.phases)
    retention = sum(c.bytes for c in memory.components if c.name == "malloc retention") if live else 0
    return (memory.total - retention) / 2**20, (memory.total - state - CPU_RUNTIME - retention) / 2**20


def cell_rows(store: dict, args: argparse.Namespace) -> tuple[list[str], list[float]]:
    """One Markdown row per measured cell, with the planner's per-rank prediction; the prediction errors."""
    rows, errors = [], []
    for key in sorted(
        (k for k in store if not k.startswith("_")), key=lambda k: (k.split("/")[0], int(k.split("/")[1]), k)
    ):
        cell = store[key]
        model, length, n, *live = key.split("/")
        if model not in args.models:
            continue
        allocator = "live (mmap)" if live else "default"
        if not cell["ok"]:
            rows.append(
                f"| {model} | {int(length):,} | {n[1:]} | {allocator} | failed: {cell['reason']} | | | | | | | |"
            )
            continue
        total, act = predict(model, int(length), int(n[1:]), bool(live))
        peak, measured_act = peak_of(cell), activation_of(cell)
        seconds = statistics.median(max(s) for s in zip(*(r["seconds"] for r in cell["ranks"]), strict=True))
        err = total / peak - 1
        errors.append(err)
        rows.append(
            f"| {model} | {int(length):,} | {n[1:]} | {allocator} | {peak:,.0f} | {total:,.0f} | {total / peak:.2f}"
            f"{'' if abs(err) <= TOLERANCE else ' **(out)**'} | {measured_act:,.0f} | {act:,.0f} | "
            f"{act / measured_act:.2f} | {int(length) / seconds:,.0f} | {len(cell['ranks'][0]['seconds'])} |"
        )
    return rows, errors


def verdicts(store: dict, args: argparse.Namespace, searches: dict) -> list[str]:
    """The Done-when targets, each said plainly as met or not."""
    lines = []
    for model, live in ((m, live) for live in (False, True) for m in args.models):
        one, two = (store.get(cell_key(model, args.length, n, live), {}) for n in (1, 2))
        if one.get("ok") and two.get("ok"):
            ratio = activation_of(two) / activation_of(one)
            met = "met" if ratio <= TARGET_ACTIVATION else "**not met**"
            lines.append(
                f"- {model}, {args.length:,} tokens, {'live (forced mmap)' if live else 'default allocator'}: "
                "activation per rank at N = 2 / one process = "
                f"{activation_of(two):,.0f} / {activation_of(one):,.0f} MB = **{ratio:.2f}×** "
                f"(target ≤ {TARGET_ACTIVATION}×: {met}); peak per rank {peak_of(two):,.0f} vs {peak_of(one):,.0f} MB."
            )
    for (model, live), found in searches.items():
        one, two = found[1]["longest"], found[2]["longest"]
        if one and two:
            met = "met" if two / one >= TARGET_LONGEST else "**not met**"
            lines.append(
                f"- {model}, {'live (forced mmap)' if live else 'default allocator'}, cap {found['cap']:,.0f} MB per "
                f"process: longest length one process {one:,}, N = 2 "
                f"{two:,} = **{two / one:.2f}×** (target ≥ {TARGET_LONGEST}×: {met}). Trials (length: fits) — "
                f"one process {found[1]['trials']}, N = 2 {found[2]['trials']}."
            )
        elif live == args.force_mmap:  # the other mode's search is read back only where its command ran it
            mode = "live (forced mmap)" if live else "default allocator"
            lines.append(
                f"- {model}, {mode}: longest-length search incomplete "
                f"(trials {found[1]['trials']}, {found[2]['trials']})."
            )
    return lines


PROTOCOL = (
    "Each cell is fresh processes: one plain process, or `accelerate launch --multi_gpu --num_processes 2` with "
    "`ACCELERATE_USE_CPU=true` and `train.sequence_parallel_size=2` (DeepSpeed Ulysses over gloo, as users launch "
    "it; each rank keeps T/2 tokens). A rank loads the model through ctxext's training path, starts the split, runs "
    "a 256-token warm-up step, reads its resident set (the baseline: model, optimizer state, runtime, plus DeepSpeed "
    "and gloo at N = 2), then runs the timed steps of one T-token row (forward, backward, AdamW step, between "
    "barriers), resetting its resident high-water mark (`/proc/self/clear_refs`) before each. Measured peak = the "
    "largest per-step high-water mark of the worst rank; activation = peak − baseline (the same instrument in both "
    "runs). tokens/s = T / median step time of the group (N = 2 uses two cores, one process uses one).\n\n"
    "Models (LoRA r=8 on every projection, YaRN to T, gradient checkpointing, chunked loss 1024, micro-batch 1): "
    "`grown` = `builtin:grown-code-64-mk` (hidden 256, 4 layers, 4 heads, vocabulary 2048), nf4 double-quant base; "
    "`wide` = a random Llama built by the script (hidden 1024, 8 heads and 8 key/value heads of 128, 2 layers, "
    "intermediate 2752, the grown model's 2048-token vocabulary), fp32 base, nf4 off (the CPU nf4 kernels would add "
    "time, not activation memory).\n\n"
    "Longest length under a cap: cap = the one-process peak of the first step at the cells' length; a length fits "
    "when every rank's first-step peak is ≤ the cap. Each trial is a fresh launch of one step; the search starts at "
    "the linear estimate from the measured cell and walks in steps until a fitting length sits next to a failing "
    "one. Peaks are compared rather than enforced with `RLIMIT_AS`: an address-space limit counts virtual "
    "reservations (thread stacks, mapped libraries, gloo's and DeepSpeed's arenas) that never become resident, and "
    "would charge the two-process run for memory it does not use.\n\n"
    "Allocator: `default` rows run with glibc's own malloc, what a user runs (the planner's CPU terms include a "
    "malloc-retention term for it). glibc keeps freed heap memory, and whether it mmaps a large tensor depends on "
    "what was freed before (its dynamic threshold grows up to 32 MB, the size of one 8k-token × 1024 fp32 tensor), "
    "so these peaks include a retention that changes from launch to launch, most for the wide model. `live (mmap)` "
    "rows run with `MALLOC_MMAP_THRESHOLD_=65536`: every allocation above 64 KiB is mmapped and returned when "
    "freed, so the peak is the live peak; their planned figures leave the retention term out.\n\n"
    "Planned = `ctxext.planner.plan.plan_recipe` for the same recipe on the CPU device with N processes "
    "(`ctxext plan --sp N` on this machine): the per-rank total, and its activation share (total − predicted "
    "weights and trainable state − the fitted Python + torch runtime term)."
)


def report(store: dict, args: argparse.Namespace, searches: dict) -> str:
    """The Markdown page."""
    rows, errors = cell_rows(store, args)
    within = sum(abs(e) <= TOLERANCE for e in errors)
    verdict = "met" if errors and within == len(errors) else "**not met**"
    worst = max(errors, key=abs, default=0)
    planner = (
        f"- planner per-rank total within ±{TOLERANCE:.0%} of the measured peak: {within} of {len(errors)} cells "
        f"({verdict}; worst {worst:+.1%})."
    )
    commands = " and ".join(f"`{c}` ({mode} rows)" for mode, c in sorted(store.get("_commands", {}).items()))
    return (
        "# Sequence parallelism: one process vs N = 2 over gloo (measured)\n\n"
        f"Commands: {commands}; measurements are kept in `{args.out.with_suffix('.json').name}`, and a rerun "
        "measures only cells missing there (`--remeasure` to redo them).\n\n"
        f"Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. Machine: {platform.machine()} CPU, 2 cores shared with other "
        f"work, {mem_total_gb():.0f} GB RAM, no GPU; {args.threads} torch thread(s) per process: **speed is "
        "indicative only; memory is the claim.**\n\n"
        f"{PROTOCOL}\n\n"
        "| model | seq len | N | allocator | measured peak MB/rank | planned MB/rank | planned / measured | measured "
        "activation MB/rank | planned activation MB/rank | planned / measured | tokens/s (group) | steps |\n"
        "| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n"
        + "\n".join(rows)
        + "\n\nDone-when targets:\n\n"
        + "\n".join([*verdicts(store, args, searches), planner])
        + "\n"
    )


def main(argv: list[str] | None = None) -> None:
    """Parse arguments; be a worker rank, or measure every cell, search the longest lengths and write the page."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party()  # the CLI's silencer: library notes would bury the measurements
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--length", type=int, default=8192, help="the length of the 1-process vs N=2 cells")
    parser.add_argument("--repeats", type=int, default=2, help="timed steps per cell")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--search", nargs="*", choices=MODELS, default=["grown"], help="models to search lengths on")
    parser.add_argument("--step", type=int, default=1024, help="granularity of the longest-length search")
    parser.add_argument("--max-length", type=int, default=32768)
    parser.add_argument("--max-trials", type=int, default=6, help="launches per longest-length search")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    parser.add_argument("--out", type=Path, default=RESULTS_MD, help="the page (measurements kept next to it, .json)")
    parser.add_argument(
        "--force-mmap", action="store_true", help="measure with glibc mmap forced (live peaks; cells kept apart)"
    )
    parser.add_argument("--remeasure", action="store_true", help="measure cells already in the JSON again")
    parser.add_argument("--worker", nargs=4, metavar=("MODEL", "LENGTH", "REPEATS", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        model, length, repeats, out = args.worker
        worker(model, int(length), int(repeats), out, args.model_dir, args.threads)
        return
    if args.step % 2:
        parser.error("--step: must be even (a multiple of N = 2)")
    stored = args.out.with_suffix(".json")
    store = json.loads(stored.read_text()) if stored.is_file() else {}
    args.fresh = set()
    command = f"nice -n 5 python -m benchmarks.sequence_parallel --length {args.length} --repeats {args.repeats}"
    command += f" --models {' '.join(args.models)} --search {' '.join(args.search)} --step {args.step}"
    # Each allocator mode's cells are measured by their own command; the page names both.
    store.setdefault("_commands", {})["live (mmap)" if args.force_mmap else "default"] = command + (
        " --force-mmap" if args.force_mmap else ""
    )
    for model in args.models:
        for n in (1, 2):
            measured(args, store, (model, args.length, n, args.force_mmap), args.repeats)
    searches: dict = {}
    for model, live in ((m, live) for live in (False, True) for m in args.search):
        one = store.get(cell_key(model, args.length, 1, live), {})
        if not one.get("ok"):
            continue
        cap = peak_of(one, first=True)  # every search trial is one step: compare first steps
        searches[model, live] = {"cap": cap, **{n: longest_under(args, store, model, n, cap, live) for n in (1, 2)}}
    stored.write_text(json.dumps(store, indent=1, sort_keys=True) + "\n")
    page = report(store, args, searches)
    print(page)
    args.out.write_text(page)
    print(f"wrote {args.out} (measurements in {stored.name})")


if __name__ == "__main__":
    main()
