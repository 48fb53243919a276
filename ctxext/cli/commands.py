"""The ``ctxext`` command line (typer). Heavy modules are imported inside commands, so help is fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from ctxext.cli.console import EXIT_BAD_INPUT, EXIT_FAILED, console, err_console, friendly_errors, plain, print_line
from ctxext.recipe.flags import ROPE_OPTIONS, SETTINGS, MethodOptionsCommand, settings_command
from ctxext.rope.methods import METHODS

app = typer.Typer(
    name="ctxext",
    help="Extend the context window of Hugging Face causal LMs: patch RoPE, fine-tune with QLoRA, evaluate, publish.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", help="show third-party warnings and progress bars that ctxext hides")
    ] = False,
) -> None:
    """Extend the context window of Hugging Face causal LMs: patch RoPE, fine-tune with QLoRA, evaluate, publish."""
    from ctxext.cli.quiet import quiet_third_party

    quiet_third_party(verbose)


# ------------------------------------------------------------------------------------------------
# Core commands: inspect, extend, validate, methods
# ------------------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def inspect(
    model: Annotated[str, typer.Argument(help="model folder, Hub id, or builtin:NAME")],
    config_only: Annotated[
        bool,
        typer.Option("--config-only", help="do not load weights; build the rotary modules from the config"),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for scripts")] = False,
    revision: Annotated[str | None, typer.Option(help="Hub revision")] = None,
    original_length: Annotated[
        int | None, typer.Option(help="pretraining context, when the config cannot tell it")
    ] = None,
) -> None:
    """Show a model's RoPE (type, theta, factor, contexts, wavelengths) and check its runtime against its config."""
    from ctxext.extend.inspection import inspect_model

    info = inspect_model(model, config_only=config_only, revision=revision, original_length=original_length)
    if as_json:
        print(json.dumps(info, indent=2, default=str))
    else:
        table = Table(title=f"RoPE of {model}", show_header=False)
        table.add_column("field", style="cyan")
        table.add_column("value")
        rows = [
            ("architecture", info["architecture"]),
            ("rope type", info["rope_type"]),
            ("rope_theta", f"{info['rope_theta']:g}"),
            ("factor", f"{info['factor']:g}"),
            ("original context", str(info["original_context"])),
            ("current context", str(info["current_context"])),
            ("max_position_embeddings", str(info["max_position_embeddings"])),
            ("rotary dim / head dim", f"{info['rotary_dim']} / {info['head_dim']}"),
            ("attention scaling", f"{info['attention_scaling']:.6g}"),
            ("shortest wavelength", f"{info['shortest_wavelength']:.3g} tokens"),
            (
                "longest wavelength",
                f"{info['longest_wavelength']:.4g} tokens "
                f"({info['longest_wavelength'] / info['current_context']:.3g}× the current context)",
            ),
            (
                "dims with λ > original ctx",
                f"{info['dims_longer_than_original_context']} of {info['rotary_dim'] // 2}",
            ),
        ]
        for key, value in rows:
            table.add_row(plain(key), plain(value))
        for key, msg in info["config_problems"].items():
            table.add_row(f"[red]problem[/] {plain(key)}", plain(msg))
        for note in info["notes"]:
            table.add_row("[yellow]note[/]", plain(note))
        check = info["runtime_check"]
        mark = "[green]✓[/]" if check["ok"] else "[bold red]✗ MISMATCH[/]"
        table.add_row("runtime RoPE", f"{mark} {plain(check['summary'])} — {plain(check['mode'])}")
        console.print(table)
    if not info["runtime_check"]["ok"] or info["config_problems"]:
        raise typer.Exit(EXIT_FAILED)


@app.command(cls=MethodOptionsCommand)
@friendly_errors
def extend(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help="model folder, Hub id, or builtin:NAME")],
    method: Annotated[str, typer.Option("--method", "-m", help=", ".join(METHODS))],
    target_length: Annotated[int, typer.Option("--target-length", "-t", help="new context length in tokens")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output model folder (must not exist)")],
    original_length: Annotated[
        int | None, typer.Option(help="pretraining context, when the config cannot tell it")
    ] = None,
    legacy_fields: Annotated[
        bool, typer.Option("--legacy-fields", help="also write rope_scaling/rope_theta for transformers < 5")
    ] = False,
    overwrite: Annotated[
        bool, typer.Option(help="replace an earlier `ctxext extend` output at --out (never any other folder)")
    ] = False,
    relative_to: Annotated[
        str | None,
        typer.Option(
            "--relative-to",
            help="for an already-extended model: 'original' replaces its extension (scale from the pretraining "
            "length), 'current' stacks on it (scale from its current context)",
        ),
    ] = None,
) -> None:
    """Write a RoPE-extended copy of a model that plain transformers loads (training-free).

    The method options (--beta-fast, --rope-theta …) are generated from the method declarations.
    """
    from ctxext.extend.folder import extend_folder
    from ctxext.rope.methods import get_method

    get_method(method)  # an unknown method fails before any model is read
    options = dict(ctx.meta.get(ROPE_OPTIONS, {}))
    with console.status(f"extending {plain(model)} with {plain(method)} to {target_length} tokens"):
        plan = extend_folder(
            model,
            out,
            method,
            target_length,
            options=options,
            original_length=original_length,
            write_legacy=legacy_fields,
            overwrite=overwrite,
            relative_to=relative_to,
        )
    verified = plan.notes.pop()  # extend_folder's last note: what was verified on the written folder
    console.print("[green]✓[/] ", end="")
    console.print(
        f"wrote {out}: {method} ×{plan.factor:g} ({plan.original_length} → {plan.target_length} tokens); "
        f"reloaded from disk: {verified}",
        markup=False,
        highlight=False,
    )
    console.print(f"  rope_parameters = {json.dumps(plan.rope_parameters)}", markup=False, highlight=False)
    console.print(f"  max_position_embeddings = {plan.max_position_embeddings}")
    for note in plan.notes:
        console.print(f"  [yellow]note:[/] {plain(note)}")


@app.command()
@friendly_errors
def validate(
    recipes: Annotated[list[Path] | None, typer.Argument(help="recipe YAML file(s)")] = None,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="key=value override (repeatable)")] = None,
    schema: Annotated[
        bool, typer.Option("--schema", help="list every recipe key with its type, default and meaning")
    ] = False,
) -> None:
    """Validate recipe files against the schema, the model, the RoPE plan and the eval suite (exit code 2 if any)."""
    from ctxext.cli.validate import check_recipe, distance_lines
    from ctxext.recipe.schema import RecipeError, load_recipe

    if schema:
        from ctxext.recipe.schema import schema_lines

        for line in schema_lines():
            console.print(line, markup=False, highlight=False)
        if not recipes:
            return
    if not recipes:
        err_console.print("[bold red]error:[/] give a recipe file (or --schema to list the keys)")
        raise typer.Exit(EXIT_BAD_INPUT)
    failed = False
    for path in recipes:
        try:
            recipe = load_recipe(path, overrides or [])
            warnings = check_recipe(recipe, str(path))
            notes = distance_lines(recipe, str(path))
        except RecipeError as exc:
            failed = True
            err_console.print(f"[bold red]✗ {plain(exc.source)}[/]: {len(exc.problems)} problem(s)")
            for key, msg in exc.problems:
                err_console.print(f"  [yellow]{plain(key)}[/]: {plain(msg)}")
            continue
        console.print(
            f"[green]✓[/] {plain(path)}: {plain(recipe.model.path)}, {recipe.rope.method} → "
            f"{recipe.rope.target_length}, seq_len {recipe.seq_len}, {recipe.train.max_steps} steps"
        )
        for note in notes:
            console.print(f"  {note}", soft_wrap=True, markup=False, highlight=False)
        for warning in warnings:
            err_console.print(f"  [yellow]warning:[/] {plain(warning)}", soft_wrap=True)
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def methods() -> None:
    """List the RoPE extension methods and their options (recipe key rope.NAME, flag --NAME)."""
    from rich.markup import escape

    table = Table(title="RoPE extension methods")
    for col in ("method", "what it does", "options"):
        table.add_column(col)
    for spec in METHODS.values():
        options = [
            f"{o.name}: {o.type_name}" + ("" if o.default is None else f" = {o.default!r}") for o in spec.options
        ]
        table.add_row(spec.name, spec.summary, escape("\n".join(options)) or "-")
    console.print(table)


# ------------------------------------------------------------------------------------------------
# train
# ------------------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def train(
    recipe: Annotated[Path, typer.Argument(help="recipe YAML file (see recipes/)")],
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key=value overrides, e.g. train.max_steps=10 output.dir=runs/x")
    ] = None,
    resume: Annotated[
        bool, typer.Option("--resume", help="continue the run in output.dir from its last checkpoint")
    ] = False,
    strict: Annotated[
        bool, typer.Option("--strict", help="refuse to start when `ctxext plan` predicts it will not fit")
    ] = False,
) -> None:
    """Fine-tune a RoPE-extended model with QLoRA on long documents (also under `accelerate launch -m ctxext train`)."""
    from ctxext.cli.validate import check_recipe
    from ctxext.recipe.schema import load_recipe
    from ctxext.training.run import train as run_training

    parsed = load_recipe(recipe, overrides or [])
    # Before any model is loaded: problems that would surface only after training (an eval suite that
    # does not exist), and settings that run but teach nothing (train.seq_len within the original window).
    for warning in check_recipe(parsed, str(recipe)):
        err_console.print(f"[yellow]warning:[/] {plain(warning)}", soft_wrap=True)
    _check_memory(parsed, strict, str(recipe))
    searched = None
    if parsed.search is not None:
        # A search: section finds the longrope factors first (in output.dir/search); training starts from them.
        from ctxext.search.recipe import search_before_training

        searched = search_before_training(parsed, log=print_line)
        parsed = searched.recipe
        if resume and not (Path(parsed.output.dir) / "run.json").is_file():
            # Interrupted during its search: the run itself has not started, so there is nothing else to resume.
            err_console.print(f"note: {plain(parsed.output.dir)}: the search is done; the training starts now")
            resume = False
    result = run_training(
        parsed, resume=resume, command=list(sys.argv), search=searched.record if searched is not None else None
    )
    if result.model is not None:  # the main process: evaluate, then publish, as the recipe asks
        _after_training(result.run_dir, parsed)


def _after_training(run_dir: Path, recipe: Any) -> None:
    """The recipe's eval suite, then its Hub push: the CLI chains these workflows, training does not."""
    if recipe.eval.suite:
        from ctxext.evaluation.suite import run_suite_for_run

        run_suite_for_run(run_dir, recipe)
    if recipe.hub.push:
        from ctxext.publish.hub import push_run

        push_run(run_dir, recipe.hub)


# ------------------------------------------------------------------------------------------------
# plan
# ------------------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    return f"{n / 2**30:,.2f}"


def _print_plan(plan: Any) -> None:
    """The per-component table, the verdict, the longest length, throughput and advice."""
    from rich.markup import escape

    from ctxext.planner.plan import HEADROOM, usable

    s, dev = plan.setup, plan.device
    head = (
        f"{plan.model} ({plan.shape.layers} layers, hidden {plan.shape.hidden}, vocab {plan.shape.vocab:,}) — "
        f"seq_len {s.seq_len:,} × micro-batch {s.micro_batch}, {s.quantization}, LoRA r={s.lora_r}, "
        f"{s.optimizer}, checkpointing {'on' if s.checkpointing else 'off'}, {s.attention}, {s.loss} loss"
        + (f" (chunk {s.loss_chunk})" if s.loss == "chunked" else "")
        + f", {s.world} GPU(s)"
        + (f", context parallel {s.context_parallel}" if s.context_parallel > 1 else "")
        + (f", sequence parallel {s.sequence_parallel}" if s.sequence_parallel > 1 else "")
        + (f", {s.sharding}" if s.sharding != "none" else "")
    )
    console.print(head, markup=False)
    console.print(f"[dim]config: {plain(plan.config_source)}[/]")
    table = Table(title=f"memory per {'process' if dev.kind == 'cpu' else 'GPU'} (GiB)")
    table.add_column("group")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("how", style="dim")
    peak = plan.memory.peak_phase
    for c in plan.memory.components:
        name = c.name if peak in c.phases else f"{c.name} [dim](not at the peak)[/]"
        table.add_row(c.group, name, _gib(c.bytes), escape(c.detail))
    table.add_row("[bold]total[/]", f"[bold]peak ({peak} phase)[/]", f"[bold]{_gib(plan.memory.total)}[/]", "")
    table.add_row("device", dev.name, _gib(dev.memory), dev.note)
    table.add_row("", f"usable ({1 - HEADROOM:.0%})", _gib(usable(dev)), "headroom for what the model leaves out")
    console.print(table)
    if plan.fits:
        console.print(f"[bold green]fits[/]: {_gib(plan.memory.total)} of {_gib(usable(dev))} usable GiB")
    else:
        console.print(
            f"[bold red]does not fit[/]: {_gib(plan.memory.total)} GiB needed, {_gib(usable(dev))} usable GiB"
        )
    if plan.what_if:
        console.print("same step with " + "; with ".join(f"{k}: {_gib(v)} GiB" for k, v in plan.what_if.items()))
    if plan.longest is not None or plan.fits is not None:
        longest = f"{plan.longest:,} tokens" if plan.longest else "none (not even 1,024 tokens)"
        console.print(f"longest seq_len that fits with these settings: [bold]{longest}[/]")
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
        console.print(levers)
    if plan.advice:
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
        console.print(adv)


@app.command()
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
    if loss not in ("chunked", "full"):
        raise InputError(f"--loss: {loss!r} is not chunked or full")
    device = lookup_gpu(gpu) if gpu else custom_gpu(gpu_memory, tflops) if gpu_memory else cpu_device()
    if sp is not None:
        overrides = [*(overrides or []), f"train.sequence_parallel_size={sp}"]
        num_gpus = sp if num_gpus == 1 and nodes == 1 else num_gpus  # --sp 4 alone plans 4 GPUs
    parsed = load_recipe(recipe, overrides or [])
    result = plan_recipe(
        parsed, device, num_gpus=num_gpus, nodes=nodes, sharding=sharding, loss=loss, utilization=utilization
    )
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        _print_plan(result)


def _check_memory(recipe: Any, strict: bool, path: str = "RECIPE.yaml") -> None:
    """Plan the recipe on this machine before training; warn (or, strict, refuse) when it will not fit."""
    import os

    from ctxext.errors import InputError
    from ctxext.planner.plan import plan_on_this_machine

    main_process = os.environ.get("RANK", "0") == "0"
    try:
        result = plan_on_this_machine(recipe)
    except InputError as exc:
        if main_process:
            err_console.print(f"[yellow]warning:[/] could not plan the memory of this run: {plain(exc)}")
        return
    if result.fits:
        return
    needed, have = result.memory.total / 2**30, result.device.memory / 2**30
    first = next((a for a in result.advice if a.fits), None)
    hint = f" Re-planned to fit: {first.summary} ({' '.join(first.overrides) or first.launch})." if first else ""
    message = (
        f"the plan predicts {needed:.1f} GiB per process on {result.device.name} ({have:.1f} GiB): this run will "
        f"probably run out of memory.{hint} The breakdown: `ctxext plan {path} --cpu` (or --gpu NAME)."
    )
    if strict:
        raise InputError(message + " (--strict: not started)")
    if main_process:
        err_console.print(f"[yellow]warning:[/] {plain(message)}")


# ------------------------------------------------------------------------------------------------
# search
# ------------------------------------------------------------------------------------------------


@app.command(cls=settings_command("ctxext.recipe.search:SearchOptions", panel="Search settings (a recipe's search:)"))
@friendly_errors
def search(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Argument(help="model folder, Hub id, or builtin:NAME")] = None,
    target_length: Annotated[int | None, typer.Option("--target-length", "-t", help="new context length")] = None,
    out: Annotated[Path | None, typer.Option("--out", "-o", help="output model folder (log and report inside)")] = None,
    original_length: Annotated[
        int | None, typer.Option(help="pretraining context, when the config cannot tell it")
    ] = None,
    recipe: Annotated[
        Path | None,
        typer.Option(help="take model, target and search settings from a recipe's model/rope/search (flags win)"),
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when available)")] = None,
    resume: Annotated[bool, typer.Option("--resume", help="continue the search logged in --out")] = False,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
) -> None:
    """Search per-dimension RoPE long factors (LongRoPE-style, training-free) and write the extended model.

    The search settings (--objective, --samples …) are generated from their declaration
    (ctxext/recipe/search.py); their defaults are the recommended settings (docs/search.md).
    """
    from ctxext.errors import InputError
    from ctxext.recipe.flags import build_settings
    from ctxext.search.run import SearchSettings, run_search

    given = dict(ctx.meta.get(SETTINGS, {}))
    runtime: dict[str, Any] = {"device": device, "resume": resume, "overwrite": overwrite}
    if original_length is not None:
        runtime["original_length"] = original_length
    if recipe is not None:
        from ctxext.recipe.schema import load_recipe
        from ctxext.search.recipe import settings_from_recipe

        settings = settings_from_recipe(load_recipe(recipe), out=out, given={**given, **runtime})
    else:
        named = (("MODEL", model), ("--target-length", target_length), ("--out", out))
        missing = [name for name, v in named if v is None]
        if missing:
            raise InputError(f"missing {', '.join(missing)} (or give --recipe)")
        run = {"model": model, "target_length": target_length, "out": out}
        settings = build_settings(SearchSettings, given, {**run, **runtime})
    result = run_search(settings, log=print_line)
    console.print(
        f"[green]✓[/] wrote {plain(result.out)}: longrope, {result.evaluations} candidates in {result.seconds:.0f} s "
        f"({result.cpu_seconds:.0f} s CPU), training objective {result.score:.4f} "
        f"(best seed {plain(result.best_seed['name'])}: {result.best_seed['score']:.4f}); runtime RoPE verified"
    )
    cmp_ = result.report.get("comparison") if result.report else None
    if cmp_:
        obj = cmp_["objective"]
        console.print(
            f"  held-out objective vs best named method ({plain(cmp_['best_named'])}): {obj['diff']:+.4f} NLL/token "
            f"(95% CI {obj['ci_low']:+.4f} … {obj['ci_high']:+.4f}); report: {plain(result.out)}/report.md"
        )


# ------------------------------------------------------------------------------------------------
# eval
# ------------------------------------------------------------------------------------------------

# The eval commands live in ctxext/cli/evaluate.py (typer only; heavy imports happen inside commands).
from ctxext.cli.evaluate import eval_app  # noqa: E402

app.add_typer(eval_app, name="eval")

from ctxext.cli.tasks import tasks_app  # noqa: E402

app.add_typer(tasks_app, name="tasks")

# ``ctxext export`` (a folder other stacks load, with their commands) lives in ctxext/cli/export.py.
from ctxext.cli.export import export_cmd  # noqa: E402

app.command("export")(export_cmd)

# ------------------------------------------------------------------------------------------------
# merge, push
# ------------------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def merge(
    run: Annotated[Path, typer.Argument(help="run folder written by `ctxext train`")],
    out: Annotated[Path, typer.Option("--out", "-o", help="merged model folder to write (must not exist)")],
    tolerance: Annotated[
        float | None,
        typer.Option(help="max |Δlogit| vs base + adapter (default: 1e-3 float32, 0.1 float16, 0.5 bfloat16)"),
    ] = None,
    smoke_length: Annotated[
        int | None, typer.Option(help="tokens per smoke-test sequence (default: the run's target length)")
    ] = None,
    sequences: Annotated[int, typer.Option(help="random sequences whose logits are compared")] = 2,
    device: Annotated[str, typer.Option(help="auto (CUDA if available), cpu, cuda, cuda:N")] = "auto",
    dtype: Annotated[
        str, typer.Option(help="auto (float32 on CPU, the base's dtype on GPU), float32, bfloat16, float16")
    ] = "auto",
    force: Annotated[bool, typer.Option("--force", help="merge a run whose training did not complete")] = False,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
) -> None:
    """Merge a run's LoRA + trained modules into the full-precision base, smoke-test it at the target length."""
    from ctxext.publish.merge import merge_run

    result = merge_run(
        run,
        out,
        tolerance=tolerance,
        smoke_length=smoke_length,
        sequences=sequences,
        device=device,
        dtype=dtype,
        allow_incomplete=force,
        overwrite=overwrite,
        log=print_line,
    )
    console.print(
        f"[green]✓[/] {plain(out)}: logits within {result.tolerance:g} of base + adapter "
        f"(max |Δ| {result.max_abs_diff:.3g}) at {result.length} tokens; loads in plain transformers"
    )


@app.command()
@friendly_errors
def push(
    run_or_dir: Annotated[Path, typer.Argument(help="run folder, or a merged model folder from `ctxext merge`")],
    repo_id: Annotated[str, typer.Option("--repo-id", help="target repository, USER/NAME")],
    private: Annotated[
        bool, typer.Option("--private/--public", help="visibility of a newly created repository")
    ] = True,
    revision: Annotated[str | None, typer.Option(help="branch to push to (created if missing)")] = None,
    merged: Annotated[
        bool, typer.Option("--merged", help="publish the merged model (a run is merged into RUN/merged first)")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="write the model card and list the files; send nothing")
    ] = False,
    report: Annotated[
        list[Path] | None, typer.Option("--report", help="extra eval report.json for the card (repeatable)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="publish a run whose training did not complete")] = False,
    message: Annotated[str | None, typer.Option("--message", "-m", help="commit message")] = None,
) -> None:
    """Publish the adapter (or merged model) with a generated model card to the Hugging Face Hub, as one commit."""
    from ctxext.publish.hub import push as push_folder

    result = push_folder(
        run_or_dir,
        repo_id,
        private=private,
        revision=revision,
        merged=merged,
        dry_run=dry_run,
        force=force,
        report=list(report or []),
        commit_message=message,
        log=print_line,
    )
    if not result.dry_run:
        console.print(f"[green]✓[/] published {plain(repo_id)}: {plain(result.commit_url)}")


# ------------------------------------------------------------------------------------------------
# demo
# ------------------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def demo(
    out: Annotated[Path, typer.Option(help="output folder (reused as a cache by later runs)")] = Path("runs/demo"),
    model: Annotated[str, typer.Option(help="base model")] = "builtin:grown-code-64-mk",
    method: Annotated[
        str | None, typer.Option(help="extension method of the fine-tune (default llama3; YaRN is always shown too)")
    ] = None,
    steps: Annotated[int | None, typer.Option(help="QLoRA steps (default 240; 6 with --quick)")] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="a reduced setting (CI): every stage, little work (6 QLoRA steps)")
    ] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="recompute every step instead of reusing --out")] = False,
    plain: Annotated[
        bool, typer.Option("--plain", help="fine-tune on plain code only, not the retrieval mixture (comparison)")
    ] = False,
) -> None:
    """Grown model → evaluate unpatched at 4× → extend (YaRN, llama3) → nf4 QLoRA → evaluate all, compared."""
    from ctxext.artifacts.lock import folder_lock
    from ctxext.cli.demo import DemoSettings, run_demo

    settings = DemoSettings.quick(out) if quick else DemoSettings(out=out)
    settings.model, settings.fresh, settings.plain = model, fresh, plain
    if method is not None:
        settings.method = method
    if steps is not None:
        settings.train_steps = steps
    with folder_lock(out):  # one demo per folder: --fresh deletes what a running demo is writing
        run_demo(settings, console)


def main() -> None:
    """Entry point of the ``ctxext`` console script."""
    app()


if __name__ == "__main__":
    main()
