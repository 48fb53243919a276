"""``ctxext search``: a LongRoPE-style search of per-dimension RoPE factors (its settings are generated flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from ctxext.cli.console import console, friendly_errors, plain, print_line
from ctxext.models.builtin import model_reference_help
from ctxext.recipe.flags import SETTINGS


@friendly_errors
def search(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Argument(help=model_reference_help())] = None,
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
