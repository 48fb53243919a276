"""The ``ctxext`` command line (typer). Heavy modules are imported inside commands, so help is fast."""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    name="ctxext",
    help="Extend the context window of Hugging Face causal LMs: patch RoPE, fine-tune with QLoRA, evaluate, publish.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

F = TypeVar("F", bound=Callable[..., Any])

# Exit codes: 2 for bad input (recipe, options, paths), 1 for a failure while working.
EXIT_BAD_INPUT = 2
EXIT_FAILED = 1


def friendly_errors(fn: F) -> F:
    """Turn ctxext's user-facing errors into a red message and an exit code, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ctxext.config import RecipeError
        from ctxext.rope import RopeError
        from ctxext.sources import SourceError

        try:
            return fn(*args, **kwargs)
        except RecipeError as exc:
            err_console.print(f"[bold red]invalid recipe[/] {exc.source}: {len(exc.problems)} problem(s)")
            for key, msg in exc.problems:
                err_console.print(f"  [yellow]{key}[/]: {msg}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except (RopeError, SourceError, FileExistsError, FileNotFoundError) as exc:
            err_console.print(f"[bold red]error:[/] {exc}")
            raise typer.Exit(EXIT_BAD_INPUT) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]interrupted[/]")
            raise typer.Exit(130) from None
        except Exception as exc:
            # Errors of the later stages (training, evaluation, hub) subclass CtxextError.
            from ctxext.errors import CtxextError

            if isinstance(exc, CtxextError):
                err_console.print(f"[bold red]error:[/] {exc}")
                raise typer.Exit(exc.exit_code) from None
            raise

    return wrapper  # type: ignore[return-value]


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
) -> None:
    """Show a model's RoPE (type, theta, factor, contexts, wavelengths) and check its runtime frequencies."""
    from ctxext.inspect import inspect_model

    info = inspect_model(model, config_only=config_only, revision=revision)
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
            table.add_row(key, value)
        for key, msg in info["config_problems"].items():
            table.add_row(f"[red]problem[/] {key}", msg)
        check = info["runtime_check"]
        mark = "[green]✓[/]" if check["ok"] else "[bold red]✗ MISMATCH[/]"
        table.add_row("runtime RoPE", f"{mark} {check['summary']} — {check['mode']}")
        console.print(table)
    if not info["runtime_check"]["ok"] or info["config_problems"]:
        raise typer.Exit(EXIT_FAILED)


@app.command()
@friendly_errors
def extend(
    model: Annotated[str, typer.Argument(help="model folder, Hub id, or builtin:NAME")],
    method: Annotated[str, typer.Option("--method", "-m", help="linear, ntk, dynamic, yarn, llama3, theta, longrope")],
    target_length: Annotated[int, typer.Option("--target-length", "-t", help="new context length in tokens")],
    out: Annotated[Path, typer.Option("--out", "-o", help="output model folder (must not exist)")],
    original_length: Annotated[
        int | None, typer.Option(help="pretraining context, when the config cannot tell it")
    ] = None,
    beta_fast: Annotated[float | None, typer.Option(help="yarn: β, rotations above which a dim is kept")] = None,
    beta_slow: Annotated[
        float | None, typer.Option(help="yarn: α, rotations below which a dim is interpolated")
    ] = None,
    attention_factor: Annotated[
        float | None, typer.Option(help="yarn/longrope: override the attention scaling")
    ] = None,
    low_freq_factor: Annotated[float | None, typer.Option(help="llama3: low frequency factor (default 1)")] = None,
    high_freq_factor: Annotated[float | None, typer.Option(help="llama3: high frequency factor (default 4)")] = None,
    rope_theta: Annotated[float | None, typer.Option(help="theta: the new base (e.g. 1e6)")] = None,
    factor: Annotated[float | None, typer.Option(help="dynamic: factor s (default target/original)")] = None,
    alpha: Annotated[float | None, typer.Option(help="ntk: the NTK alpha (default target/original)")] = None,
    factors_file: Annotated[
        Path | None, typer.Option(help="longrope: JSON with short_factor and long_factor lists")
    ] = None,
    legacy_fields: Annotated[
        bool, typer.Option("--legacy-fields", help="also write rope_scaling/rope_theta for transformers < 5")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
) -> None:
    """Write a RoPE-extended copy of a model that plain transformers loads (training-free)."""
    from ctxext.extend import extend_folder
    from ctxext.rope import METHODS

    options = {
        "beta_fast": beta_fast,
        "beta_slow": beta_slow,
        "attention_factor": attention_factor,
        "low_freq_factor": low_freq_factor,
        "high_freq_factor": high_freq_factor,
        "rope_theta": rope_theta,
        "factor": factor,
        "alpha": alpha,
        "factors_file": str(factors_file) if factors_file else None,
    }
    if method not in METHODS:
        from ctxext.rope import RopeError

        raise RopeError(f"unknown method {method!r}; choose one of: {', '.join(METHODS)}")
    with console.status(f"extending {model} with {method} to {target_length} tokens"):
        plan = extend_folder(
            model,
            out,
            method,
            target_length,
            options=options,
            original_length=original_length,
            write_legacy=legacy_fields,
            overwrite=overwrite,
        )
    console.print(
        f"[green]✓[/] wrote {out}: {method} ×{plan.factor:g} ({plan.original_length} → {plan.target_length} tokens), "
        "runtime RoPE verified"
    )
    console.print(f"  rope_parameters = {json.dumps(plan.rope_parameters)}")
    console.print(f"  max_position_embeddings = {plan.max_position_embeddings}")
    for note in plan.notes:
        console.print(f"  [yellow]note:[/] {note}")


@app.command()
@friendly_errors
def validate(
    recipes: Annotated[list[Path], typer.Argument(help="recipe YAML file(s)")],
    overrides: Annotated[list[str] | None, typer.Option("--set", help="key=value override (repeatable)")] = None,
) -> None:
    """Validate recipe files; every problem is reported with its key (exit code 2 if any)."""
    from ctxext.config import RecipeError, load_recipe

    failed = False
    for path in recipes:
        try:
            recipe = load_recipe(path, overrides or [])
        except RecipeError as exc:
            failed = True
            err_console.print(f"[bold red]✗ {exc.source}[/]: {len(exc.problems)} problem(s)")
            for key, msg in exc.problems:
                err_console.print(f"  [yellow]{key}[/]: {msg}")
            continue
        console.print(
            f"[green]✓[/] {path}: {recipe.model.path}, {recipe.rope.method} → {recipe.rope.target_length}, "
            f"seq_len {recipe.seq_len}, {recipe.train.max_steps} steps"
        )
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


@app.command()
def methods() -> None:
    """List the RoPE extension methods and their options."""
    from ctxext.rope import METHODS

    table = Table(title="RoPE extension methods")
    for col in ("method", "what it does", "options"):
        table.add_column(col)
    for spec in METHODS.values():
        table.add_row(spec.name, spec.summary, ", ".join(sorted(spec.options)) or "-")
    console.print(table)


# ------------------------------------------------------------------------------------------------
# train (issue 3)
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
) -> None:
    """Fine-tune a RoPE-extended model with QLoRA on long documents (also under `accelerate launch -m ctxext train`)."""
    from ctxext.config import load_recipe
    from ctxext.train import train as run_training

    parsed = load_recipe(recipe, overrides or [])
    run_training(parsed, resume=resume, command=list(sys.argv))


# ------------------------------------------------------------------------------------------------
# eval (issue 4)
# ------------------------------------------------------------------------------------------------

# The eval commands live in ctxext/evaluation/cli.py (typer only; heavy imports happen inside commands).
from ctxext.evaluation.cli import eval_app  # noqa: E402

app.add_typer(eval_app, name="eval")

# ------------------------------------------------------------------------------------------------
# merge, push (issue 5)
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
    from ctxext.merge import merge_run

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
        log=console.print,
    )
    console.print(
        f"[green]✓[/] {out}: logits within {result.tolerance:g} of base + adapter "
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
    from ctxext.hub import push as push_folder

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
        log=lambda line: console.print(line, markup=False, highlight=False),
    )
    if not result.dry_run:
        console.print(f"[green]✓[/] published {repo_id}: {result.commit_url}")


# ------------------------------------------------------------------------------------------------
# demo (issue 6)
# ------------------------------------------------------------------------------------------------


@app.command()
@friendly_errors
def demo(
    out: Annotated[Path, typer.Option(help="output folder (reused as a cache by later runs)")] = Path("runs/demo"),
    model: Annotated[str, typer.Option(help="base model")] = "builtin:grown-code-64",
    method: Annotated[str, typer.Option(help="extension method")] = "yarn",
    steps: Annotated[int | None, typer.Option(help="QLoRA steps (default 120; 6 with --quick)")] = None,
    quick: Annotated[bool, typer.Option("--quick", help="a reduced setting (CI): same steps, little work")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="recompute every step instead of reusing --out")] = False,
    plain: Annotated[
        bool, typer.Option("--plain", help="fine-tune on plain code only, not the retrieval mixture (comparison)")
    ] = False,
) -> None:
    """Grown model → evaluate unpatched at 4× → extend with YaRN → nf4 QLoRA → evaluate all three, compared."""
    from ctxext.demo import DemoSettings, run_demo

    settings = DemoSettings.quick(out) if quick else DemoSettings(out=out)
    settings.model, settings.method, settings.fresh, settings.plain = model, method, fresh, plain
    if steps is not None:
        settings.train_steps = steps
    run_demo(settings, console)


def main() -> None:
    """Entry point of the ``ctxext`` console script."""
    app()


if __name__ == "__main__":
    sys.exit(main())
