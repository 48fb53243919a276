"""``ctxext plan``: predict a recipe's per-GPU training memory from its config, and print the breakdown."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ctxext.cli.console import console, friendly_errors, plain


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f}"


def _header(plan: Any) -> str:
    s = plan.setup
    trained = {"full": "full fine-tune (every weight)", "lora": f"LoRA r={s.lora_r}", "qlora": f"QLoRA r={s.lora_r}"}
    return (
        f"{plan.model} ({plan.shape.layers} layers, hidden {plan.shape.hidden}, vocab {plan.shape.vocab:,}) — "
        f"seq_len {s.seq_len:,} × micro-batch {s.micro_batch}, {trained[plan.mode]}, {s.quantization}, "
        f"{s.optimizer}{' (offloaded)' if s.offload_optimizer else ''}, checkpointing "
        f"{'on' if s.checkpointing else 'off'}, {s.attention}, {s.loss} loss"
        + (f" (chunk {s.loss_chunk})" if s.loss == "chunked" else "")
        + f", {s.world} GPU(s)"
        + (f", context parallel {s.context_parallel}" if s.context_parallel > 1 else "")
        + (f", sequence parallel {s.sequence_parallel}" if s.sequence_parallel > 1 else "")
        + (f", {s.sharding}" if s.sharding != "none" else "")
    )


def _memory_table(plan: Any) -> Table:
    from rich.markup import escape

    from ctxext.planner.fit import HEADROOM, usable

    dev = plan.device
    table = Table(title=f"memory per {'process' if dev.kind == 'cpu' else 'GPU'} (GiB)")
    table.add_column("group")
    table.add_column("component")
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("basis: how", style="dim")
    peak = plan.memory.peak_phase
    for c in plan.memory.components:
        name = c.name if peak in c.phases else f"{c.name} [dim](not at the peak)[/]"
        table.add_row(c.group, name, _gib(c.bytes), escape(f"{c.basis}: {c.detail}"))
    table.add_row("[bold]total[/]", f"[bold]peak ({peak} phase)[/]", f"[bold]{_gib(plan.memory.total)}[/]", "")
    if plan.band:
        band = f"{_gib(plan.band.low)}–{_gib(plan.band.high)}"
        table.add_row("", "error band", band, escape(f"measured: {plan.band.describe()}"))
    table.add_row("device", dev.name, _gib(dev.memory), dev.note)
    table.add_row("", f"usable ({1 - HEADROOM:.0%})", _gib(usable(dev)), "headroom for what the model leaves out")
    return table


def _verdict(plan: Any) -> None:
    from ctxext.planner.fit import usable

    need = plan.band.high if plan.band else plan.memory.total
    said = f"{_gib(plan.memory.total)} GiB planned, {_gib(need)} at the band's upper end"
    if plan.fits:
        console.print(f"[bold green]fits[/]: {said}, of {_gib(usable(plan.device))} usable GiB")
    else:
        console.print(f"[bold red]does not fit[/]: {said}, {_gib(usable(plan.device))} usable GiB")
    if plan.what_if:
        console.print("same step with " + "; with ".join(f"{k}: {_gib(v)} GiB" for k, v in plan.what_if.items()))
    longest = f"{plan.longest:,} tokens" if plan.longest else "none (not even 1,024 tokens)"
    console.print(f"longest seq_len that fits with these settings: [bold]{longest}[/] (its band's upper end fits)")


def _levers_table(plan: Any) -> Table:
    from rich.markup import escape

    levers = Table(title="memory levers, each planned on and off (largest gain first)")
    for col in ("lever", "in this plan", "recipe override (on)", "longest on", "longest off", "buys"):
        levers.add_column(col)
    for e in plan.levers:
        levers.add_row(
            escape(e.name),
            "on" if e.on else "off",
            escape(e.key) or "(always on)",
            *(f"{n:,}" if n else "-" for n in (e.longest_on, e.longest_off)),
            f"{e.buys:+,}",
        )
    return levers


def _advice_table(plan: Any) -> Table:
    from rich.markup import escape

    adv = Table(title="advice (each re-planned)")
    for col in ("change", "recipe overrides / launch", "GiB", "fits", "longest seq_len"):
        adv.add_column(col)
    for a in plan.advice:
        how = " ".join(a.overrides) + (f"\n{a.launch}" if a.launch else "")
        adv.add_row(
            escape(a.summary),
            escape(how) or "-",
            _gib(a.total),
            "[green]yes[/]" if a.fits else "[red]no[/]",
            f"{a.longest:,}" if a.longest else "-",
        )
    return adv


def _print_plan(plan: Any) -> None:
    """The per-component table, the verdict, the longest length, throughput and advice."""
    s, dev = plan.setup, plan.device
    console.print(_header(plan), markup=False)
    console.print(f"[dim]config: {plain(plan.config_source)}[/]")
    if plan.choice:  # what the recipe left to the machine, decided for this device (the table plans that)
        console.print(plain(plan.choice.line), markup=False, soft_wrap=True)
    console.print(_memory_table(plan))
    _verdict(plan)
    if plan.tokens_per_second:
        hours = plan.wall_seconds / 3600
        console.print(
            f"throughput: ~{plan.tokens_per_second:,.0f} tokens/s at {plan.utilization:.0%} of {dev.tflops:g} bf16 "
            f"TFLOP/s × {s.world} ({plan.flops_per_token / 1e9:.1f} GFLOP/token); {plan.max_steps} steps × "
            f"{plan.tokens_per_step:,} tokens ≈ {hours:.1f} h"
        )
    for note in plan.notes + plan.memory.notes:
        console.print(f"[yellow]note:[/] {plain(note)}")
    if plan.levers:
        console.print(_levers_table(plan))
    if plan.advice:
        console.print(_advice_table(plan))


@friendly_errors
def plan(
    recipe: Annotated[Path | None, typer.Argument(help="recipe YAML file (see recipes/)")] = None,
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides, e.g. train.seq_len=131072")
    ] = None,
    gpu: Annotated[str | None, typer.Option("--gpu", help="a GPU from the table (ctxext plan --list-gpus)")] = None,
    gpu_memory: Annotated[
        str | None, typer.Option("--gpu-memory", help="memory of another GPU: 80GB, 80GiB, 24g")
    ] = None,
    tflops: Annotated[float | None, typer.Option(help="bf16 TFLOP/s of a --gpu-memory GPU, for tokens/s")] = None,
    cpu: Annotated[bool, typer.Option("--cpu", help="plan a CPU run against this machine's RAM")] = False,
    num_gpus: Annotated[int, typer.Option("--num-gpus", help="GPUs per node")] = 1,
    sp: Annotated[
        int | None, typer.Option("--sp", help="split each sequence over N GPUs (train.sequence_parallel_size=N)")
    ] = None,
    nodes: Annotated[int, typer.Option("--nodes", help="nodes")] = 1,
    sharding: Annotated[
        str, typer.Option(help="auto (FSDP2 with context parallelism, else none/DDP), ddp, fsdp2, zero3")
    ] = "auto",
    loss: Annotated[
        str, typer.Option(help="chunked (ctxext) or full (full-length logits, for comparison)")
    ] = "chunked",
    utilization: Annotated[float, typer.Option(help="fraction of the bf16 peak assumed for tokens/s")] = 0.4,
    mode: Annotated[
        str | None,
        typer.Option(help="qlora, lora or full (every weight trained); default: what the recipe trains"),
    ] = None,
    offload_optimizer: Annotated[
        bool, typer.Option("--offload-optimizer", help="full fine-tune: optimizer states in host memory")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    list_gpus: Annotated[bool, typer.Option("--list-gpus", help="list the GPU table and exit")] = False,
) -> None:
    """Predict per-GPU training memory of a recipe from its model config (no weights): fit, longest length, advice."""
    from ctxext.errors import InputError
    from ctxext.models.devices import GIB, GPUS, cpu_device, custom_gpu
    from ctxext.models.devices import gpu as lookup_gpu
    from ctxext.planner.plan import plan_recipe
    from ctxext.recipe.schema import load_recipe

    if list_gpus:
        for d in GPUS.values():
            console.print(f"{d.name:10} {d.memory / GIB:7.1f} GiB {d.tflops:7g} bf16 TFLOP/s  {d.note}", markup=False)
        return
    if recipe is None:
        raise InputError("pass a recipe: ctxext plan RECIPE.yaml --gpu NAME (or --list-gpus)")
    if sum(x is not None for x in (gpu, gpu_memory, cpu or None)) != 1:
        raise InputError("pass exactly one of --gpu NAME, --gpu-memory SIZE or --cpu")
    if tflops is not None and gpu_memory is None:  # a table GPU has its own figure; a CPU plan has no tokens/s
        raise InputError(
            f"--tflops {tflops:g}: applies only to a GPU described by --gpu-memory; a --gpu from the table has its own "
            "TFLOP/s and --cpu plans memory only. Drop --tflops, or plan with --gpu-memory SIZE --tflops N"
        )
    if loss not in ("chunked", "full"):
        raise InputError(f"--loss: {loss!r} is not chunked or full")
    device = lookup_gpu(gpu) if gpu else custom_gpu(gpu_memory, tflops) if gpu_memory else cpu_device()
    if sp is not None:
        overrides = [*(overrides or []), f"train.sequence_parallel_size={sp}"]
        num_gpus = sp if num_gpus == 1 and nodes == 1 else num_gpus  # --sp 4 alone plans 4 GPUs
    parsed = load_recipe(recipe, overrides or [])
    result = plan_recipe(
        parsed,
        device,
        num_gpus=num_gpus,
        nodes=nodes,
        sharding=sharding,
        loss=loss,
        utilization=utilization,
        mode=mode,
        offload_optimizer=offload_optimizer,
    )
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        _print_plan(result)
