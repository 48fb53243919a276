"""``ctxext tasks``: list the registered synthetic tasks, export them for standard harnesses (lm-eval)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from ctxext.cli.console import console, friendly_errors, plain

tasks_app = typer.Typer(
    help="Synthetic long-range tasks: list them, export them as lm-evaluation-harness task files.",
    no_args_is_help=True,
)

TasksOpt = Annotated[str, typer.Option("--tasks", help="comma-separated registered task names, e.g. needle,multikey")]
LengthsOpt = Annotated[str, typer.Option("--lengths", help="sample lengths in the model's tokens, e.g. 256,1024")]
DepthsOpt = Annotated[str, typer.Option(help="needle depths in percent (the RULER-style suite's default)")]
TrialsOpt = Annotated[int, typer.Option(help="samples per (task, length, depth)")]
SeedOpt = Annotated[int, typer.Option(help="sample seed (the same seed gives ctxext's own grid samples)")]
HaystackOpt = Annotated[str, typer.Option(help="haystack text: file, folder, jsonl, builtin:stdlib, or noise")]
TemplatesOpt = Annotated[str, typer.Option(help="templates: heldout, training, all, or indices like 0,2")]


def export_settings(tasks: str, lengths: str, **given: Any) -> Any:
    """The validated sampling settings of an export (the RULER-style suite's, from the flags).

    Args:
        tasks: comma-separated registered task names (``--tasks``).
        lengths: comma-separated lengths in tokens (``--lengths``).
        **given: ``depths`` (comma-separated, as the flag), ``trials``, ``seed``, ``haystack``, ``templates``
            (``heldout``/``training``/``all`` or comma-separated indices), ``chat_template``, ``answer_margin``,
            ``allow_beyond_context``; one not given
            takes the declared default (:class:`~ctxext.evaluation.sections.ruler.engine.RulerSettings`).

    Raises:
        InputError: a value the declaration refuses, named by its flag.
    """
    from ctxext.errors import InputError
    from ctxext.evaluation.sections.ruler.engine import RulerSettings
    from ctxext.recipe.flags import build_settings

    def numbers(text: str, flag: str, kind: type) -> list[Any]:
        try:
            return [kind(x) for x in text.replace(" ", "").split(",") if x]
        except ValueError:
            raise InputError(f"{flag}: expected comma-separated numbers, got {text!r}") from None

    names = [t for t in tasks.replace(" ", "").split(",") if t]
    if not names:
        raise InputError("--tasks: name at least one task (see `ctxext tasks list`)")
    if "depths" in given:
        given["depths"] = numbers(given["depths"], "--depths", float)
    templates = given.get("templates")
    if templates is not None and templates not in ("heldout", "training", "all"):
        given["templates"] = numbers(templates, "--templates", int)
    run = {"tasks": [{"task": n} for n in names], "lengths": numbers(lengths, "--lengths", int)}
    settings = build_settings(RulerSettings, given, run)
    settings.check()
    return settings


@tasks_app.command("list")
@friendly_errors
def list_cmd() -> None:
    """The registered synthetic tasks, their templates and options."""
    from rich.table import Table

    from ctxext.tasks import get_task, task_names

    table = Table(title="registered tasks")
    for col in ("task", "what it asks", "templates (held out)", "options"):
        table.add_column(col)
    for name in task_names():
        t = get_task(name)
        opts = ", ".join(f"{k}={v}" for k, v in t.options.items()) or "-"
        table.add_row(
            name, plain(t.description), f"{len(t.templates)} ({', '.join(map(str, t.heldout)) or '-'})", plain(opts)
        )
    console.print(table)


@tasks_app.command("export")
@friendly_errors
def export_cmd(
    out: Annotated[Path, typer.Argument(help="folder to write (lm_eval --include_path)")],
    model: Annotated[str, typer.Option("--model", "-m", help="model whose tokenizer builds the prompts")],
    tasks: TasksOpt,
    lengths: LengthsOpt,
    fmt: Annotated[str, typer.Option("--format", help="lm-eval (task YAML over local JSONL)")] = "lm-eval",
    depths: DepthsOpt = "10,50,90",
    trials: TrialsOpt = 10,
    seed: SeedOpt = 0,
    haystack: HaystackOpt = "builtin:stdlib",
    templates: TemplatesOpt = "heldout",
    chat_template: Annotated[
        str,
        typer.Option(
            "--chat-template",
            help="auto (the tokenizer's chat template for an instruct model, plain prompts for a base model), "
            "tokenizer (its chat template on any model), none, or a Jinja chat template file",
        ),
    ] = "auto",
    answer_margin: Annotated[
        int, typer.Option("--answer-margin", help="tokens every document may generate beyond its answer")
    ] = 8,
    allow_beyond_context: Annotated[
        bool, typer.Option("--allow-beyond-context", help="export lengths above the model's context")
    ] = False,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="replace an earlier export at OUT")] = False,
) -> None:
    """Write registered tasks as lm-eval task files (one per task × length) with prompts built by ctxext."""
    from ctxext.errors import InputError
    from ctxext.evaluation.export_tasks import FORMATS, export_lm_eval

    if fmt not in FORMATS:
        raise InputError(f"--format {fmt!r}: supported formats are {', '.join(FORMATS)}")
    picked = {"depths": depths, "trials": trials, "seed": seed, "haystack": haystack, "templates": templates}
    picked |= {"chat_template": chat_template, "answer_margin": answer_margin}
    settings = export_settings(tasks, lengths, **picked, allow_beyond_context=allow_beyond_context)
    command = " ".join(shlex.quote(a) for a in ["ctxext", *sys.argv[1:]])
    result = export_lm_eval(model, out, settings, overwrite=overwrite, command=command)
    console.print(
        f"chat template: {plain(result.chat_template)} ({plain(result.chat_template_reason)})",
        soft_wrap=True,
        highlight=False,
    )
    for t in result.tasks:
        console.print(
            f"[green]✓[/] {plain(t.name)}: {t.documents} prompts of {t.length} tokens, answer budget "
            f"{t.max_gen_toks} tokens (≥ {t.margin} beyond every answer), stops {plain(repr(t.until))}, "
            f"{t.tokens_match}/{t.documents} re-tokenize to the grid's exact tokens",
            soft_wrap=True,
        )
    console.print(
        f"run: lm_eval --model hf --model_args pretrained=MODEL_DIR,max_length={result.max_length} "
        f"--include_path {shlex.quote(str(out))} --tasks {','.join(result.tags)}\n"
        f"or, on the model ctxext verified: ctxext eval harness --model {shlex.quote(model)} "
        f"--include-path {shlex.quote(str(out))} "
        f"--tasks {','.join(result.tags)} --out REPORT_DIR",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )
