"""``ctxext export SRC --for vllm|lm-eval|helmet``: a folder other stacks load with its RoPE, and their commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ctxext.cli.console import console, friendly_errors, plain, print_line


@friendly_errors
def export_cmd(
    src: Annotated[Path, typer.Argument(help="run folder (merged into --out) or model folder (used as it is)")],
    targets: Annotated[list[str], typer.Option("--for", help="vllm, lm-eval or helmet (repeatable)")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="merged folder to write (a run only)")] = None,
    overwrite: Annotated[bool, typer.Option(help="replace an earlier merge at --out")] = False,
) -> None:
    """Make a run or model folder load with its RoPE in vLLM / lm-eval / HELMET, and write their commands."""
    from ctxext.publish.export import COMMANDS_FILE, export_for

    folder, text = export_for(src, targets, out, overwrite=overwrite, log=print_line)
    console.print(text, markup=False, highlight=False, soft_wrap=True)
    if out is not None:
        console.print(f"[green]✓[/] {plain(folder)}: merged model and {COMMANDS_FILE}")
