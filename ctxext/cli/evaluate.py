"""``ctxext eval``: perplexity, passkey, needle, QA and suites, for one or several models side by side."""

from __future__ import annotations

import functools
import gc
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
    """The ``eval`` commands: those written below, and one per registered suite section without one.

    A section's command is generated when ``ctxext eval`` runs (:func:`section_command`), so a section
    registered by then (a plugin module imported first) has its subcommand; ``ctxext --help`` builds none.
    """

    def list_commands(self, ctx: Any) -> list[str]:
        """The written commands, then the registered sections' (``toy_repeat`` → ``toy-repeat``)."""
        from ctxext.evaluation.sections import SECTIONS

        own = list(super().list_commands(ctx))
        return own + [c for c in (_command_name(s) for s in SECTIONS.values()) if c not in own]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        """A written command, else the generated command of the registered section of that name."""
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        from ctxext.evaluation.sections import SECTIONS

        section = next((s for s in SECTIONS.values() if _command_name(s) == cmd_name), None)
        return section_command(section) if section is not None else None


def _command_name(section: Any) -> str:
    # A section's command: its own name for it (perplexity: ppl), else its suite key with hyphens.
    return section.command or section.name.replace("_", "-")


eval_app = typer.Typer(
    cls=_EvalGroup,
    help="Evaluate long-context quality: perplexity by length / position, passkey and needle grids, QA, suites.",
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
BeyondOpt = Annotated[
    bool,
    typer.Option(
        "--allow-beyond-context", help="evaluate lengths above a model's context (marked †) instead of failing"
    ),
]
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


def _check_reference(specs: list[Any], reference: str | None) -> None:
    # Fail before any model is evaluated, not after an hour of scoring.
    from ctxext.evaluation.paired import choose_reference

    choose_reference([{"name": s.label()} for s in specs], reference)


def _note_work(what: str, lengths: list[Any], per_length: int) -> None:
    """Before a large evaluation starts: how much it scores (:func:`~ctxext.evaluation.perplexity.work_estimate`).

    Lengths given in tokens are counted; relative ones (``2x``) resolve per model later and are not.
    """
    from ctxext.cli.console import err_console
    from ctxext.evaluation.perplexity import work_estimate

    tokens = [n for n in lengths if isinstance(n, int)]
    line = work_estimate(what, tokens, per_length) if tokens and per_length else None
    if line:
        err_console.print(f"note: {line}", markup=False, highlight=False, soft_wrap=True)


def _run(
    models: list[str], out: Path, shared: Shared, task: str, fn: Callable[[Any], dict[str, Any]], data: dict[str, Any]
) -> dict[str, Any]:
    """Evaluate every model with ``fn``, write one report with the results under ``task``, print its summary."""
    from ctxext.artifacts.lock import folder_lock
    from ctxext.atomic import check_inputs_outside, check_output
    from ctxext.cli.console import console, plain
    from ctxext.evaluation.report import REPORT_KIND, build_report, model_entry, write_report
    from ctxext.models.load import load_model, parse_model_specs

    device, overwrite, reference = shared.device, shared.overwrite, shared.reference
    specs = parse_model_specs(models, shared.adapter, shared.name)
    # Before any work: an output that cannot be written must not cost an evaluation.
    check_inputs_outside(out, [p for s in specs for p in (s.ref, s.adapter, s.config_from) if p], report=True)
    check_output(out, REPORT_KIND, overwrite)
    with folder_lock(out):  # one writer per folder, from the first check to the last write
        _check_reference(specs, reference)
        entries = []
        for spec in specs:
            with console.status(f"loading {plain(spec.label())}"):
                loaded = load_model(spec, device=device)
            console.print(
                f"[green]✓[/] {plain(loaded.name)}: rope {loaded.rope.rope_type} ×{loaded.rope.factor:g}, context "
                f"{loaded.context_length} (original {loaded.original_length}), runtime RoPE verified"
            )
            entry = model_entry(loaded)
            entry[task] = fn(loaded)
            entries.append(entry)
            del loaded
            gc.collect()
        command = " ".join(shlex.quote(a) for a in ["ctxext", *sys.argv[1:]])
        report = build_report(entries, data=data, command=command, reference=reference)
        write_report(report, out, overwrite=overwrite)
        _print_summary(report, out)
        return report


def _print_summary(report: dict[str, Any], out: Path) -> None:
    from rich.table import Table

    from ctxext.cli.console import console, plain

    for m in report["models"]:
        name = plain(m["name"])
        if m.get("perplexity"):
            p = m["perplexity"]
            table = Table(title=f"perplexity — {name} ({p['mode']})")
            for col in ("length", "ppl", "95% CI", "docs", "tokens"):
                table.add_column(col)
            for L, e in p["by_length"].items():
                if e.get("ppl") is not None:
                    mark = " †" if e.get("beyond_context") else ""
                    table.add_row(
                        L + mark,
                        f"{e['ppl']:.4g}",
                        f"{e['ci_low']:.4g}–{e['ci_high']:.4g}",
                        str(e["documents"]),
                        str(e["tokens"]),
                    )
            if p.get("short_context") and p["short_context"].get("ppl"):
                s = p["short_context"]
                table.add_row(
                    f"{s['length']} (original)",
                    f"{s['ppl']:.4g}",
                    f"{s['ci_low']:.4g}–{s['ci_high']:.4g}",
                    str(s["documents"]),
                    str(s["tokens"]),
                )
            console.print(table)
        if m.get("ruler"):
            eff = m["ruler"]["effective_length"]
            per_task = ", ".join(
                f"{t} {e['effective_length']['length'] or 'n/a'}" for t, e in m["ruler"]["tasks"].items()
            )
            console.print(f"ruler — {name}: effective length {eff['length'] or 'n/a'} ({plain(per_task)})")
            for scoring, named in (m["ruler"].get("effective_lengths") or {}).items():
                both = "; ".join(f"{e['name']} {e['length'] or 'n/a'}" for e in named.values())
                console.print(f"ruler — {name} ({scoring.replace('_', '-')}): {plain(both)}")
        for line in _section_summaries(m):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    _print_comparisons(report.get("comparisons"))
    console.print(f"[green]✓[/] report written to {plain(out)}/report.json, report.md and PNG plots")


def _section_summaries(entry: dict[str, Any]) -> list[str]:
    # The console lines of the registered sections a model entry has (SuiteSection.summary).
    from ctxext.evaluation.sections import SECTIONS

    found = (registered.summary(entry) if entry.get(key) else None for key, registered in SECTIONS.items())
    return [f"{key} — {entry['name']}: {line}" for key, line in zip(SECTIONS, found, strict=True) if line]


def _print_comparisons(comp: dict[str, Any] | None) -> None:
    from ctxext.cli.console import console, plain

    if not comp or not comp["comparisons"]:
        return
    ref = comp["reference"]
    for r in comp["perplexity"]:
        if r["view"] == "length":
            console.print(
                f"paired — {plain(r['model'])} / {plain(ref)} ppl@{r['length']}: {r['ratio']:.3f}× "
                f"[{r['ci_low']:.3f}, {r['ci_high']:.3f}] over {r['documents']} documents, p Holm {r['p_holm']:.2g}"
            )
    for r in comp["grids"]:
        console.print(
            f"paired — {plain(r['model'])} vs {plain(ref)} {plain(r['task'])}@{r['length']}: {r['a_correct']} vs "
            f"{r['b_correct']} of {r['trials']}, McNemar p {r['p_value']:.2g} (Holm {r['p_holm']:.2g})"
        )
    for r in comp.get("attention") or []:
        console.print(
            f"paired — {plain(r['model'])} − {plain(ref)} attention beyond the original window at {r['length']}: "
            f"{r['difference'] * 100:+.1f} pts [{r['ci_low'] * 100:+.1f}, {r['ci_high'] * 100:+.1f}] over "
            f"{r['documents']} documents"
        )
    console.print(f"({comp['comparisons']} paired comparisons; p Holm is adjusted over all of them)")


def _settings(model: str, section: str) -> type[Any]:
    """The command class whose flags are generated from a model of ctxext/evaluation/settings.py (a suite section)."""
    return settings_command(f"ctxext.evaluation.settings:{model}", panel=f"Settings (a suite's {section}: keys)")


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    from ctxext.cli.console import friendly_errors

    return friendly_errors(fn)


def section_command(section: Any) -> Any:
    """The ``ctxext eval <name>`` command of a registered suite section: a suite holding only that section.

    Its flags are the section's settings fields (generated, with the model's defaults); ``--model``, ``--out``
    and the options every ``eval`` command takes come with it; the report is ``ctxext eval run``'s.

    Args:
        section: a registered :class:`~ctxext.evaluation.sections.SuiteSection`.

    Returns:
        The click command.
    """
    import inspect as _inspect

    app = typer.Typer(add_completion=False)
    doc = _inspect.getdoc(type(section)) or section.title or section.name
    panel = f"Settings (a suite's {section.name}: keys)"

    @app.command(_command_name(section), cls=settings_command(section.settings, panel=panel), help=doc)
    @_friendly
    @_shared
    def command(ctx: typer.Context, shared: Shared, model: ModelOpt, out: OutOpt) -> None:
        settings = build_settings(section.settings, ctx.meta.get(SETTINGS, {}))
        _run_section(f"eval {section.name}", section.name, settings, model, out, shared)

    return typer.main.get_command(app)


@eval_app.command("ppl", cls=_settings("PerplexitySettings", "perplexity"))
@_friendly
@_shared
def ppl_cmd(ctx: typer.Context, shared: Shared, model: ModelOpt, out: OutOpt) -> None:
    """Perplexity by evaluation length and token-position bucket (truncated documents), with 95% CIs.

    The same evaluation as a suite holding only a perplexity: section (ctxext eval run): the flags are that
    section's keys, generated from their declaration, with the same defaults (the same documents).
    """
    from ctxext.evaluation.settings import PerplexitySettings

    settings = build_settings(PerplexitySettings, ctx.meta.get(SETTINGS, {}))
    _note_work("perplexity", list(settings.lengths), settings.max_docs or 0)
    _run_section("eval ppl", "perplexity", settings, model, out, shared)


@eval_app.command("passkey", cls=_settings("PasskeySettings", "passkey"))
@_friendly
@_shared
def passkey_cmd(ctx: typer.Context, shared: Shared, model: ModelOpt, out: OutOpt) -> None:
    """Passkey retrieval (Landmark Attention prompt) over lengths × depths, k seeded keys per cell, teacher-forced.

    A suite holding only a passkey: section (ctxext eval run), its keys as flags with the same defaults.
    """
    from ctxext.evaluation.settings import PasskeySettings

    settings = build_settings(PasskeySettings, ctx.meta.get(SETTINGS, {}))
    _note_work("passkey", list(settings.lengths), len(settings.depths) * settings.trials)
    _run_section("eval passkey", "passkey", settings, model, out, shared)


@eval_app.command("needle", cls=_settings("NeedleSettings", "needle"))
@_friendly
@_shared
def needle_cmd(ctx: typer.Context, shared: Shared, model: ModelOpt, out: OutOpt) -> None:
    """Needle in a haystack over lengths × depths with a configurable haystack, needle, question and answer.

    A suite holding only a needle: section (ctxext eval run), its keys as flags with the same defaults.
    """
    from ctxext.evaluation.settings import NeedleSettings

    settings = build_settings(NeedleSettings, ctx.meta.get(SETTINGS, {}))
    _note_work("needle", list(settings.lengths), len(settings.depths) * settings.trials)
    _run_section("eval needle", "needle", settings, model, out, shared)


@eval_app.command("attention", cls=_settings("AttentionTask", "attention"))
@_friendly
@_shared
def attention_cmd(
    ctx: typer.Context, shared: Shared, model: ModelOpt, out: OutOpt, allow_beyond_context: BeyondOpt = False
) -> None:
    """Attention diagnostics per layer: mass by distance band, beyond the original window, on sinks; entropy.

    The flags are the keys of a suite's attention: section, generated from their declaration (the same defaults).
    """
    from ctxext.evaluation.attention import AttentionSettings, evaluate_attention
    from ctxext.evaluation.settings import AttentionTask, resolve_length
    from ctxext.scoring.texts import describe_source, iter_texts

    declared = build_settings(AttentionTask, ctx.meta.get(SETTINGS, {}))
    AttentionSettings.of_section(declared, None, allow_beyond_context).validate()  # the bands, before any model

    def task(loaded: Any) -> dict[str, Any]:
        length = resolve_length(declared.length, loaded.original_length, loaded.context_length)
        settings = AttentionSettings.of_section(declared, length, allow_beyond_context)
        texts = iter_texts(declared.data, declared.text_field, declared.split)
        return evaluate_attention(loaded, texts, settings, not shared.quiet)

    data_info = {"attention": describe_source(declared.data, declared.text_field, declared.split)}
    _run(model, out, shared, "attention", task, data_info)


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


def _run_section(name: str, key: str, settings: Any, model: list[str], out: Path, shared: Shared) -> None:
    """Run a suite holding one section (``key``: its settings), as every one-section ``eval`` command does."""
    from ctxext.evaluation.suite import Suite

    beyond = bool(getattr(settings, "allow_beyond_context", False))
    suite = Suite.model_validate({"name": name, "allow_beyond_context": beyond, key: settings})
    _run_suite(suite, None, model, out, shared)


def _run_suite(suite: Any, suite_path: str | None, model: list[str], out: Path, shared: Shared) -> None:
    """Run a suite on the models, print its notes and the summary (``eval run``, and ``eval ppl`` as a suite)."""
    from ctxext.cli.console import console, plain
    from ctxext.evaluation.suite import run_suite
    from ctxext.models.load import parse_model_specs

    specs = parse_model_specs(model, shared.adapter, shared.name)
    _check_reference(specs, shared.reference)
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


@eval_app.command("harness")
@_friendly
@_shared
def harness_cmd(
    shared: Shared,
    model: ModelOpt,
    tasks: Annotated[
        str,
        typer.Option(
            help="comma-separated lm-eval tasks / groups / tags; with --lengths, ctxext task names are exported first"
        ),
    ],
    out: OutOpt,
    include_path: Annotated[
        Path | None, typer.Option("--include-path", help="extra lm-eval task folder (`ctxext tasks export` output)")
    ] = None,
    lengths: Annotated[
        str | None, typer.Option(help="export ctxext's tasks named in --tasks at these lengths (tokens) and run them")
    ] = None,
    depths: Annotated[str, typer.Option(help="with --lengths: depths in percent")] = "10,50,90",
    trials: Annotated[int, typer.Option(help="with --lengths: samples per (task, length, depth)")] = 10,
    seed: Annotated[int, typer.Option(help="with --lengths: sample seed")] = 0,
    templates: Annotated[str, typer.Option(help="with --lengths: heldout, training, all, or indices")] = "heldout",
    batch_size: Annotated[int, typer.Option(help="documents per generate call (1: no padding)")] = 1,
    max_length: Annotated[
        int | None, typer.Option(help="lm-eval max_length (default: model context + answer budget)")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="at most this many documents per task")] = None,
    num_fewshot: Annotated[int | None, typer.Option(help="few-shot examples (default: each task's own)")] = None,
    allow_beyond_context: BeyondOpt = False,
) -> None:
    """lm-evaluation-harness on the model ctxext loaded and verified (passed as an object: no RoPE rebuild)."""
    import tempfile

    from ctxext.evaluation.harness import HarnessSettings, check_task_data, run_harness, task_manager

    names = [t for t in tasks.replace(" ", "").split(",") if t]
    with tempfile.TemporaryDirectory(prefix="ctxext-harness-") as tmp:
        data: dict[str, Any] = {}
        if lengths is not None:
            if include_path is not None:
                from ctxext.errors import InputError

                raise InputError("give --include-path (an export) or --lengths (export now), not both")
            picked = (lengths, depths, trials, seed, templates, allow_beyond_context)
            names, include_path, data = _export_for_harness(model[0], names, picked, tmp)
        settings = HarnessSettings(
            tasks=names,
            include_path=str(include_path) if include_path else None,
            batch_size=batch_size,
            max_length=max_length,
            limit=limit,
            num_fewshot=num_fewshot,
            allow_beyond_context=allow_beyond_context,
        )
        manager = task_manager(settings)
        check_task_data(settings, manager)  # before any model is loaded
        report = _run(model, out, shared, "harness", lambda lm: run_harness(lm, settings, manager), data)
    from ctxext.cli.console import console

    for m in report["models"]:
        for name, task in m["harness"]["tasks"].items():
            shown = ", ".join(f"{k} {v:.4g}" for k, v in task["metrics"].items())
            console.print(
                f"lm-eval — {m['name']} {name}: {shown} ({task['documents']} documents)", soft_wrap=True, markup=False
            )


def _export_for_harness(
    model: str, names: list[str], picked: tuple[str, str, int, int, str, bool], tmp: str
) -> tuple[list[str], Path, dict[str, Any]]:
    """Export the registered tasks among ``names`` into ``tmp``; their tags replace them in the task list."""
    from ctxext.cli.tasks import export_settings
    from ctxext.evaluation.export_tasks import TASK_PREFIX, export_lm_eval
    from ctxext.tasks import task_names

    own = [n for n in names if n in task_names()]
    if not own:
        from ctxext.errors import InputError

        known = ", ".join(task_names())
        raise InputError(f"--lengths exports ctxext's tasks, and --tasks names none of them ({known})")
    lengths, depths, trials, seed, templates, allow_beyond = picked
    given = {"depths": depths, "trials": trials, "seed": seed, "templates": templates}
    settings = export_settings(",".join(own), lengths, **given, allow_beyond_context=allow_beyond)
    folder = Path(tmp) / "tasks"
    export_lm_eval(model, folder, settings)
    tags = [f"{TASK_PREFIX}{n}" if n in own else n for n in names]
    # The prompts are built with the first model's tokenizer: the report says which, with the sampling settings.
    return tags, folder, {"harness": {"export": {"tokenizer_of": model, "settings": settings.model_dump()}}}
