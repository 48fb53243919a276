"""``ctxext inspect``, ``ctxext extend`` and ``ctxext methods``: read a model's RoPE and write an extended copy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ctxext.cli.console import EXIT_FAILED, console, friendly_errors, plain
from ctxext.models.builtin import model_reference_help
from ctxext.recipe.flags import ROPE_OPTIONS
from ctxext.rope.methods import METHODS


@friendly_errors
def inspect(
    model: Annotated[str, typer.Argument(help=model_reference_help())],
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


@friendly_errors
def extend(
    ctx: typer.Context,
    model: Annotated[str, typer.Argument(help=model_reference_help())],
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
    from ctxext.models.folder import extend_folder
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
