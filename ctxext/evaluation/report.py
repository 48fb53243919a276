"""Evaluation reports: ``report.json``, ``report.md`` and PNG plots, models side by side.

``report.json`` follows the typed schema in :mod:`ctxext.artifacts.report` (``"schema": "ctxext.eval.report/v1"``;
fields are only added, never renamed), each section's part typed by the schema its section registered:
:func:`build_report` assembles and validates it, :func:`write_report` writes it through the schema with its
Markdown, its plots (:mod:`ctxext.evaluation.plots`) and each section's part of the model card (``card``:
:func:`card_parts`). Every part comes from the registered sections' hooks; this module knows no section.

``nll`` is the mean negative log-likelihood in nats per token, ``ppl = exp(nll)``; ``ci_low`` / ``ci_high``
bound the perplexity (95 % bootstrap over documents); accuracies carry 95 % Wilson intervals; EM / F1 are
percentages with 95 % bootstrap intervals over examples.
"""

from __future__ import annotations

import datetime as _dt
import platform
from pathlib import Path
from typing import Any

from ctxext.artifacts.report import SCHEMA, EvalReport, parse_report, split_base
from ctxext.artifacts.tables import models_table
from ctxext.atomic import atomic_folder

# The kind of output folder a report is (``ctxext.atomic``): --overwrite replaces only another report.
REPORT_KIND = "report"


def model_entry(loaded: Any) -> dict[str, Any]:
    """The ``name`` / ``model`` / ``rope`` part of a model's report entry.

    Args:
        loaded: a :class:`~ctxext.models.load.LoadedModel`.

    Returns:
        A JSON-ready dict to which task sections are added.
    """
    rope = loaded.rope.to_dict()
    rope["factor"] = loaded.rope.factor
    return {"name": loaded.name, "model": dict(loaded.info), "rope": rope}


def environment() -> dict[str, Any]:
    """Versions and device, for reproducibility."""
    import peft
    import torch
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
    }


def build_report(
    models: list[dict[str, Any]],
    data: dict[str, Any] | None = None,
    suite: dict[str, Any] | None = None,
    command: str | None = None,
    reference: str | None = None,
) -> dict[str, Any]:
    """Assemble a report from per-model entries, with paired comparisons against a reference model.

    Args:
        models: entries from :func:`model_entry` with task sections added.
        data: descriptions of the data sources per task.
        suite: the suite that ran, if any.
        command: the command line, if any.
        reference: the model every other model is compared with, paired (default: the first).

    Returns:
        The report as a dict, checked against the schema (:mod:`ctxext.artifacts.report`).

    Raises:
        InputError: the entries do not make a report of the schema (a bug in an evaluator, named by field).
    """
    from ctxext import __version__
    from ctxext.evaluation.paired import compare_models

    report = {
        "schema": SCHEMA,
        "ctxext_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "suite": suite,
        "command": command,
        "environment": environment(),
        "data": data or {},
        "models": models,
        "comparisons": compare_models(models, reference),
    }
    parse_report(report, "the evaluation report")
    return report


def write_report(report: EvalReport | dict[str, Any], out: str | Path, overwrite: bool = False) -> Path:
    """Write ``report.json`` (through the schema, with the card's parts), ``report.md`` and the PNG plots, atomically.

    Everything is written to a temporary folder next to ``out`` first and then moved in place, so an
    interrupted run never leaves a report that looks complete.

    Args:
        report: from :func:`build_report`, or a typed :class:`~ctxext.artifacts.report.EvalReport`.
        out: the output folder (created). An existing non-empty folder is refused unless ``overwrite``,
            and even then replaced only when it is a report folder ctxext wrote (see
            :func:`ctxext.atomic.check_output`).
        overwrite: replace a previous report folder.

    Returns:
        The output folder.

    Raises:
        InputError: the report does not match the schema, or ``out`` cannot be written without losing files
            ctxext did not write.
    """
    from ctxext.evaluation.plots import write_plots

    typed = report if isinstance(report, EvalReport) else parse_report(report, "the evaluation report")
    raw = typed.to_json_dict()
    typed = parse_report({**raw, "card": card_parts(raw, typed)}, "the evaluation report")
    out = Path(out)
    with atomic_folder(out, kind=REPORT_KIND, overwrite=overwrite) as tmp:
        plots = write_plots(typed.to_json_dict(), tmp)
        (tmp / "report.md").write_text(render_markdown(typed, plots))
        (tmp / "report.json").write_text(typed.to_json())
    return out


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def render_markdown(report: EvalReport | dict[str, Any], plots: dict[str, str] | None = None) -> str:
    """``report.md``: the models, each registered section's part with its plots, the paired comparisons.

    Args:
        report: the report (typed, or a dict that is validated first).
        plots: plot name → file name, embedded as images.

    Returns:
        Markdown text.
    """
    plots = plots or {}
    report = report if isinstance(report, EvalReport) else parse_report(report, "the evaluation report")
    raw = report.to_json_dict()  # the sections rendered from their JSON form (ruler, attention, comparisons)
    models = report.models
    lines = ["# ctxext evaluation report", ""]
    if report.suite:
        lines += [f"Suite: `{report.suite.get('name')}` ({report.suite.get('path')})", ""]
        if report.suite.get("interrupted"):
            lines += [
                f"**Incomplete: {report.suite['interrupted']}.** What follows is what completed before the stop; "
                "run the command again (with `--overwrite`) for the whole evaluation.",
                "",
            ]
    device = report.environment.get("device", "?")
    lines += [f"Created {report.created} with ctxext {report.ctxext_version} on {device}.", ""]
    lines += ["## Models", "", *models_table(models), *beyond_target_markdown(raw)]
    from ctxext.evaluation.sections import SECTIONS  # sections registered as plugins render themselves

    for key, registered in SECTIONS.items():
        if any(m.get(key) for m in raw["models"]):
            section = registered.markdown([m for m in raw["models"] if m.get(key)], raw)
            lines += _with_plots(section, {name: file for name, file in plots.items() if _plot_of(name, key)})
    from ctxext.evaluation.target import target_markdown

    lines += target_markdown(raw)
    comp = raw.get("comparisons")
    if comp and (comp["comparisons"] or comp["notes"]):
        lines += comparisons_markdown(comp)
    lines += [
        "---",
        f"Models: {', '.join(m.name for m in models)}. Intervals are 95 %: bootstrap over documents for "
        "perplexities, Wilson for accuracies, bootstrap over examples for EM / F1. These per-model intervals are "
        "unpaired: to compare models, read the paired comparisons (same documents, same trials), not whether "
        "intervals overlap.",
        "",
    ]
    return "\n".join(lines)


def _plot_of(plot: str, section: str) -> bool:
    # A registered section's plots are named after it (SuiteSection.plots).
    return plot == section or plot.startswith(f"{section}_")


def _with_plots(lines: list[str], plots: dict[str, str]) -> list[str]:
    # A section's plots go after its first paragraph (the heading's, or its first table); "a_b" reads "a b".
    # A plot the section's markdown already shows (by its file name) stays where the section put it.
    plots = {name: file for name, file in plots.items() if not any(f"({file})" in line for line in lines)}
    if not plots:
        return lines
    blanks = [i for i, line in enumerate(lines) if not line.strip()]
    at = blanks[1] + 1 if len(blanks) > 1 else len(lines)
    images = [f"![{name.replace('_', ' ')}]({file})" for name, file in plots.items()]
    return [*lines[:at], *images, "", *lines[at:]]


def comparisons_markdown(comp: dict[str, Any]) -> list[str]:
    """The paired model-vs-reference tables: each section's own (perplexity ratios, retrieval trials …), then notes.

    Args:
        comp: the report's ``comparisons`` section (:func:`ctxext.evaluation.paired.compare_models`).

    Returns:
        Markdown lines.
    """
    ref = comp["reference"]
    lines = [
        f"## Paired comparisons against `{ref}`",
        "",
        f"Each model against `{ref}` on the same documents and the same trials. {comp['comparisons']} comparisons "
        "in this report: p-values are also given Holm-adjusted over all of them (p Holm); read a difference as "
        "real when its adjusted p is small, not when one raw p among many is.",
        "",
    ]
    for key, registered in _paired_sections().items():  # each key's rows, drawn by its first section
        if comp.get(key):
            lines += registered.paired_markdown(comp[key], ref)
    for note in comp.get("notes") or []:
        lines += [f"Note: {note}", ""]
    return lines


def _paired_sections() -> dict[str, Any]:
    # The registered section that draws each paired key's rows: the first (in the registry's order) that uses it.
    from ctxext.evaluation.sections import SECTIONS

    found: dict[str, Any] = {}
    for key, registered in SECTIONS.items():
        found.setdefault(registered.paired_key or key, registered)
    return found


def paired_summary(comp: dict[str, Any] | None) -> list[str]:
    """Console lines of a report's paired comparisons, each section's own (none without comparisons)."""
    if not comp or not comp["comparisons"]:
        return []
    lines: list[str] = []
    for key, registered in _paired_sections().items():
        if comp.get(key):
            lines += registered.paired_summary(comp[key], comp["reference"])
    return lines + [f"({comp['comparisons']} paired comparisons; p Holm is adjusted over all of them)"]


def section_summaries(entry: dict[str, Any]) -> list[str]:
    """Console lines of one model entry: each registered section's summary, prefixed by section and model."""
    from ctxext.evaluation.sections import SECTIONS

    lines: list[str] = []
    for key, registered in SECTIONS.items():
        found = registered.summary(entry) if entry.get(key) else None
        for line in [found] if isinstance(found, str) else found or []:
            lines.append(f"{key} — {entry['name']}: {line}")
    return lines


def card_parts(report: dict[str, Any], typed: EvalReport) -> dict[str, dict[str, Any]]:
    """Each registered section's part of the model card (``card`` in ``report.json``), from the report's JSON form.

    ``rows`` from every model that has the section (:meth:`~ctxext.evaluation.sections.base.SuiteSection.card_rows`),
    ``results`` of the extended model (``card_results``) and ``cost``, the extended model against the unmodified base
    (``card_cost``); the extended model and the base are :func:`ctxext.artifacts.report.split_base`'s.

    Args:
        report: the report's JSON form.
        typed: the same report, typed.
    """
    from ctxext.evaluation.sections import SECTIONS

    extended, base = split_base(typed.models)
    by_name = {m["name"]: m for m in report["models"]}
    ext = by_name.get(extended.name) if extended is not None else None
    bas = by_name.get(base.name) if base is not None else None
    parts: dict[str, dict[str, Any]] = {}
    for key, registered in SECTIONS.items():
        have = [m for m in report["models"] if m.get(key)]
        if not have:
            continue
        part: dict[str, Any] = {"rows": registered.card_rows(have, report)}
        part["results"] = registered.card_results(ext, report) if ext is not None and ext.get(key) else []
        part["cost"] = []
        if ext is not None and bas is not None and ext.get(key) and bas.get(key):
            part["cost"] = registered.card_cost(ext, bas, report)
        parts[key] = part
    return parts


def beyond_target_markdown(report: dict[str, Any]) -> list[str]:
    """A note on lengths evaluated past the target (the reference model's configured context).

    Args:
        report: the report dict (``suite.beyond_target`` lists such lengths).

    Returns:
        Markdown lines (none without such lengths).
    """
    suite = report.get("suite") or {}
    beyond = suite.get("beyond_target") or []
    if not beyond:
        return []
    return [
        f"**Beyond target**: lengths {', '.join(map(str, beyond))} are past the target "
        f"({suite.get('reference_context')} tokens, the reference model's configured context): train short, test "
        "long. Every model is evaluated "
        "there; † marks them in the tables.",
        "",
    ]
