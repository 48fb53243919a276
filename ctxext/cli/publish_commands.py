"""``ctxext merge``, ``ctxext push`` and ``ctxext export``: a run as a merged model, on the Hub, or for other stacks."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ctxext.cli.console import console, friendly_errors, plain, print_line


def _typed_reports() -> None:
    # Register every suite section's results schema, so the evaluation reports a run carries are read typed
    # (a value out of range is refused before it reaches a card). Only the command line chains workflows.
    import ctxext.evaluation.sections  # noqa: F401


@friendly_errors
def merge(
    run: Annotated[Path, typer.Argument(help="run folder written by `ctxext train`")],
    out: Annotated[Path, typer.Option("--out", "-o", help="merged model folder to write (must not exist)")],
    tolerance: Annotated[
        float | None,
        typer.Option(help="max |Δlogit| vs base + adapter (default: 1e-3 float32, 0.1 float16, 0.5 bfloat16)"),
    ] = None,
    smoke_length: Annotated[
        int | None,
        typer.Option(help="tokens of the one full-length logits check (default: the run's target length)"),
    ] = None,
    check_length: Annotated[
        int | None,
        typer.Option(
            help="tokens of the other checks: more sequences, perplexity, passkey (default: the run's original window)"
        ),
    ] = None,
    sequences: Annotated[
        int, typer.Option(help="random sequences whose logits are compared (the first at --smoke-length)")
    ] = 2,
    device: Annotated[str, typer.Option(help="auto (CUDA if available), cpu, cuda, cuda:N")] = "auto",
    dtype: Annotated[
        str, typer.Option(help="auto (float32 on CPU, the base's dtype on GPU), float32, bfloat16, float16")
    ] = "auto",
    force: Annotated[bool, typer.Option("--force", help="merge a run whose training did not complete")] = False,
    overwrite: Annotated[bool, typer.Option(help="replace an existing --out folder")] = False,
) -> None:
    """Merge a run's LoRA + trained modules into the full-precision base, check it against base + adapter.

    One random sequence's logits are compared at the target length, the rest of the check runs at the original
    window; the command says up front how long it will take. A full fine-tune (no adapter) is written as a
    published model the same way, its calibrated temperature folded in and checked against the run folder.
    """
    from ctxext.publish.merge import merge_run

    _typed_reports()
    result = merge_run(
        run,
        out,
        tolerance=tolerance,
        smoke_length=smoke_length,
        check_length=check_length,
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

    _typed_reports()
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
