"""``ctxext eval``: ``eval run`` for a suite, and one command per registered suite section, for models side by side.

Every command is the one driver, :func:`ctxext.evaluation.suite.run_suite`: ``eval run`` on a suite file,
``eval <section>`` (``ppl``, ``passkey``, ``needle``, ``qa``, ``ruler``, ``attention``, ``harness``, ``longppl``, a
plugin's) on a suite holding only that section, its flags generated from the section's settings model. What a
section prints, notes before it starts and checks is its own (its hooks); this module knows no section.
"""

from __future__ import annotations

import functools
import inspect
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.main
from typer.core import TyperGroup

from ctxext.models.builtin import model_reference_help
from ctxext.recipe.flags import SETTINGS, build_settings, settings_command


class _EvalGroup(TyperGroup):
    """The ``eval`` commands: ``run``, and one per registered suite section.

    A section's command is generated when ``ctxext eval`` runs (:func:`section_command`), so a section
    registered by then (a plugin module imported first) has its subcommand; ``ctxext --help`` builds none.
    """

    def list_commands(self, ctx: Any) -> list[str]:
        """``run``, then the registered sections' commands (``toy_repeat`` → ``toy-repeat``)."""
        from ctxext.evaluation.sections import SECTIONS

        own = list(super().list_commands(ctx))
        return own + [c for c in (command_name(s) for s in SECTIONS.values()) if c not in own]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """``run``, else the generated command of the registered section of that name."""
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        from ctxext.evaluation.sections import SECTIONS

        section = next((s for s in SECTIONS.values() if command_name(s) == cmd_name), None)
        return section_command(section) if section is not None else None


def command_name(section: Any) -> str:
    """A section's ``ctxext eval`` command: its own name for it (perplexity: ``ppl``), else its key with hyphens."""
    return section.command or section.name.replace("_", "-")


eval_app = typer.Typer(
    cls=_EvalGroup,
    help="Evaluate long-context quality: perplexity by length / position, retrieval grids, RULER-style tasks, QA, "
    "attention, lm-eval; one model or several side by side, paired.",
    no_args_is_help=True,
)

ModelOpt = Annotated[
    list[str],
    typer.Option("--model", "-m", help=model_reference_help(run=True) + " (repeat to compare)"),
]
AdapterOpt = Annotated[
    list[str] | None, typer.Option("--adapter", help="LoRA adapter per --model, in order ('none' for no adapter)")
]
NameOpt = Annotated[list[str] | None, typer.Option("--name", help="report label per --model")]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="report folder (report.json, report.md, PNG plots)")]
DeviceOpt = Annotated[str | None, typer.Option(help="cpu or cuda (default: cuda when available)")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="no progress bars")]
OverwriteOpt = Annotated[
    bool,
    typer.Option("--overwrite", help="replace a previous report folder at --out (never a folder holding other files)"),
]
ReferenceOpt = Annotated[
    str | None,
    typer.Option(
        "--reference", help="report label of the model the others are compared with, paired (default: the first)"
    ),
]


@dataclass
class Shared:
    """The options every ``ctxext eval`` command takes besides ``--model`` and ``--out`` (see :func:`_shared`).

    Attributes:
        adapter: a LoRA adapter per model (``--adapter``).
        name: a report label per model (``--name``).
        reference: the label the other models are compared with (``--reference``).
        device: ``cpu`` or ``cuda`` (``--device``).
        quiet: no progress bars (``--quiet``).
        overwrite: replace a previous report folder (``--overwrite``).
    """

    adapter: AdapterOpt = None
    name: NameOpt = None
    reference: ReferenceOpt = None
    device: DeviceOpt = None
    quiet: QuietOpt = False
    overwrite: OverwriteOpt = False


def _shared(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Give a command the :class:`Shared` options: they are added to its CLI and passed as ``shared``."""
    own = [p for p in inspect.signature(fn, eval_str=True).parameters.values() if p.name != "shared"]
    hints = inspect.get_annotations(Shared, eval_str=True)
    added = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in fields(Shared)
    ]

    @functools.wraps(fn)
    def command(**kwargs: Any) -> Any:
        shared = Shared(**{f.name: kwargs.pop(f.name) for f in fields(Shared)})
        return fn(shared=shared, **kwargs)

    kind = inspect.Parameter.KEYWORD_ONLY
    command.__signature__ = inspect.Signature([p.replace(kind=kind) for p in own] + added)  # type: ignore[attr-defined]
    return command


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    from ctxext.cli.console import friendly_errors

    return friendly_errors(fn)


def section_command(section: Any) -> Any:
    """The ``ctxext eval <name>`` command of a registered suite section: a suite holding only that section.

    Its flags are the section's settings fields (generated, with the model's defaults); ``--model``, ``--out``
    and the options every ``eval`` command takes come with it; the report is ``ctxext eval run``'s.

    Args:
        section: a registered :class:`~ctxext.evaluation.sections.base.SuiteSection`.

    Returns:
        The click command.
    """
    app = typer.Typer(add_completion=False)
    doc = inspect.getdoc(type(section)) or section.title or section.name
    panel = f"Settings (a suite's {section.name}: keys)"
    name = command_name(section)

    @app.command(name, cls=settings_command(section.settings, panel=panel), help=doc)
    @_friendly
    @_shared
    def command(ctx: typer.Context, shared: Shared, model: ModelOpt, out: OutOpt) -> None:
        from ctxext.evaluation.suite import single_section_suite

        settings = build_settings(section.settings, ctx.meta.get(SETTINGS, {}))
        _run_suite(single_section_suite(section.name, settings, f"eval {name}"), None, model, out, shared)

    return typer.main.get_command(app)


@eval_app.command("run")
@_friendly
@_shared
def run_cmd(
    shared: Shared,
    suite: Annotated[Path, typer.Argument(help="suite YAML (eval/long-context.yaml, eval/tiny-cpu.yaml)")],
    model: ModelOpt,
    out: OutOpt,
    overrides: Annotated[list[str] | None, typer.Option("--set", help="suite override key=value (repeatable)")] = None,
) -> None:
    """Run an evaluation suite on one or several models and write one side-by-side report."""
    from ctxext.evaluation.suite import load_suite

    parsed, _ = load_suite(suite, overrides or [])
    _run_suite(parsed, str(suite), model, out, shared)


def _run_suite(suite: Any, suite_path: str | None, model: list[str], out: Path, shared: Shared) -> None:
    """Run a suite on the models, print its notes and the summary (``eval run``, and every ``eval <section>``)."""
    from ctxext.cli.console import console, err_console, plain
    from ctxext.evaluation.paired import choose_reference
    from ctxext.evaluation.sections import sections_in
    from ctxext.evaluation.suite import run_suite
    from ctxext.models.load import parse_model_specs

    specs = parse_model_specs(model, shared.adapter, shared.name)
    # Fail before any model is evaluated, not after an hour of scoring.
    choose_reference([{"name": s.label()} for s in specs], shared.reference)
    for registered, settings in sections_in(suite):
        note = registered.work_note(settings)  # large work: say so before it starts
        if note:
            err_console.print(f"note: {note}", markup=False, highlight=False, soft_wrap=True)
    report = run_suite(
        suite,
        specs,
        out,
        suite_path,
        not shared.quiet,
        command=" ".join(shlex.quote(a) for a in ["ctxext", *sys.argv[1:]]),
        device=shared.device,
        overwrite=shared.overwrite,
        reference=shared.reference,
    )
    for note in report["suite"]["notes"]:
        console.print(f"[yellow]note:[/] {plain(note)}")
    _print_summary(report, out)


def _print_summary(report: dict[str, Any], out: Path) -> None:
    """Each model's lines from its sections (their ``summary``), then each section's paired lines."""
    from ctxext.cli.console import console, plain
    from ctxext.evaluation.report import paired_summary, section_summaries

    for m in report["models"]:
        for line in section_summaries(m):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    for line in paired_summary(report.get("comparisons")):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    console.print(f"[green]✓[/] report written to {plain(out)}/report.json, report.md and PNG plots")
