"""``ctxext calibrate``: a run's attention temperature, chosen on held-out text (its settings are generated flags)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxext.cli.console import console, friendly_errors, plain, print_line
from ctxext.recipe.flags import SETTINGS


@friendly_errors
def calibrate(
    ctx: typer.Context,
    run: Annotated[Path, typer.Argument(help="run folder written by `ctxext train`")],
    data: Annotated[
        str | None,
        typer.Option(help="held-out text, as `ctxext eval` reads it (default: the run's validation split)"),
    ] = None,
    device: Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when available)")] = None,
    overwrite: Annotated[bool, typer.Option(help="measure and choose again over an earlier calibration.json")] = False,
) -> None:
    """Choose the run's attention temperature on held-out retrieval and perplexity (1.0 unless one helps).

    Writes RUN/calibration.json; loading the run (eval, merge, export) applies the choice, and the merged
    model carries it in its weights. The settings (--temperatures, --trials …) are generated from their
    declaration (ctxext/recipe/calibration.py); docs/training.md says when it helps.
    """
    from ctxext.calibration.temperature import calibrate_run
    from ctxext.recipe.calibration import CalibrationSettings
    from ctxext.recipe.flags import build_settings

    settings = build_settings(CalibrationSettings, dict(ctx.meta.get(SETTINGS, {})))
    record = calibrate_run(
        run, settings, held_out_source(run, data), device=device, overwrite=overwrite, log=print_line
    )
    assert record is not None  # no budget: it always measures
    console.print(
        f"[green]✓[/] {plain(run)}/calibration.json: attention temperature {record['attention_temperature']:g} "
        f"({record['seconds']:.0f} s)"
    )


def held_out_source(run: Path, data: str | None) -> Callable[[Any], tuple[Iterable[str], str]]:
    """The held-out texts calibration measures on, given the run's tokenizer: ``data``, or the run's validation split.

    The split is training's (the documents its ``val_loss`` reads), so the command puts the two workflows together.
    ``data`` that reads the evaluation's held-out files is refused here, before any work (the guard search uses).

    Raises:
        InputError: ``data`` overlaps the evaluation's held-out files.
    """
    if data is not None:
        from ctxext.scoring.texts import refuse_heldout

        refuse_heldout(
            data,
            "--data",
            "the attention temperature",
            "leave --data out (the run's validation documents) or name held-out text the evaluation does not read",
        )

    def named(tokenizer: Any) -> tuple[Iterable[str], str]:
        from ctxext.scoring.texts import iter_texts

        return iter_texts(str(data)), str(data)

    def validation_split(tokenizer: Any) -> tuple[Iterable[str], str]:
        from ctxext.errors import InputError
        from ctxext.recipe.schema import load_recipe
        from ctxext.training.data.mixture import held_out_texts

        recipe_file = run / "recipe.yaml"
        if not recipe_file.is_file():
            raise InputError(
                f"{recipe_file}: missing, so the run's held-out documents are unknown; name them with --data"
            )
        print_line("reading the run's held-out (validation) documents")
        return held_out_texts(load_recipe(recipe_file), tokenizer), "the run's validation documents"

    return named if data is not None else validation_split
