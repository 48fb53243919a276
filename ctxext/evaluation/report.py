"""Evaluation reports: ``report.json``, ``report.md`` and PNG plots, models side by side.

``report.json`` follows the typed schema in :mod:`ctxext.artifacts.report` (``"schema": "ctxext.eval.report/v1"``;
fields are only added, never renamed): :func:`build_report` assembles and validates it, :func:`write_report`
writes it through the schema with its Markdown and plots. The Markdown tables the model card also shows live in
:mod:`ctxext.artifacts.tables`; the plots in :mod:`ctxext.evaluation.plots`.

``nll`` is the mean negative log-likelihood in nats per token, ``ppl = exp(nll)``; ``ci_low`` / ``ci_high``
bound the perplexity (95 % bootstrap over documents); accuracies carry 95 % Wilson intervals; EM / F1 are
percentages with 95 % bootstrap intervals over examples.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
from pathlib import Path
from typing import Any

from ctxext.artifacts.report import SCHEMA, EvalReport, ModelEntry, parse_report
from ctxext.artifacts.tables import (
    bucket_table,
    fmt,
    models_table,
    num_text,
    p_text,
    ppl_cell,
    ppl_length_table,
    short_context_table,
    table,
)
from ctxext.atomic import atomic_folder

# The kind of output folder a report is (``ctxext.atomic``): --overwrite replaces only another report.
REPORT_KIND = "report"

PPL_PROTOCOL = (
    "truncated-document perplexity: each document tokenized with the tokenizer's defaults (BOS where it adds "
    "one) and cut to L tokens; token t is predicted from tokens < t; every length and bucket over the same "
    "documents (those reaching the longest length; 'all documents >= L' as a secondary view); 95% bootstrap CI "
    "over documents"
)
SLIDING_PROTOCOL = (
    "strided sliding window (transformers docs): whole documents, windows of L tokens moved by the stride, each "
    "token scored once from its window; 95% bootstrap CI over documents"
)


def model_entry(loaded: Any) -> dict[str, Any]:
    """The ``name`` / ``model`` / ``rope`` part of a model's report entry.

    Args:
        loaded: a :class:`~ctxext.evaluation.loading.LoadedModel`.

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

    for m in models:
        ppl = m.get("perplexity")
        if ppl and "protocol" not in ppl:
            ppl["protocol"] = SLIDING_PROTOCOL if ppl.get("mode") == "sliding" else PPL_PROTOCOL
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
    """Write ``report.json`` (through the schema), ``report.md`` and the PNG plots into ``out``, atomically.

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
    """``report.md``: models, perplexity by length / bucket / context limit, short-context regression, grids, QA.

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
    device = report.environment.get("device", "?")
    lines += [f"Created {report.created} with ctxext {report.ctxext_version} on {device}.", ""]
    lines += ["## Models", "", *models_table(models), *beyond_target_markdown(raw)]
    if any(m.perplexity for m in models):
        lines += _ppl_markdown(report, raw, plots)
    from ctxext.evaluation.sections import SECTIONS  # sections registered as plugins render themselves

    for key, registered in SECTIONS.items():
        if any(m.get(key) for m in raw["models"]):
            section = registered.markdown([m for m in raw["models"] if m.get(key)], raw)
            lines += _with_plots(section, {name: file for name, file in plots.items() if _plot_of(name, key)})
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
    if not plots:
        return lines
    blanks = [i for i, line in enumerate(lines) if not line.strip()]
    at = blanks[1] + 1 if len(blanks) > 1 else len(lines)
    images = [f"![{name.replace('_', ' ')}]({file})" for name, file in plots.items()]
    return [*lines[:at], *images, "", *lines[at:]]


def _ppl_markdown(report: EvalReport, raw: dict[str, Any], plots: dict[str, str]) -> list[str]:
    models = [m for m in report.models if m.perplexity]
    first = models[0].perplexity
    assert first is not None
    docs = first.documents
    lines = ["## Perplexity", ""]
    lines += [f"Data: `{report.data_source() or '?'}`. Protocol: {first.protocol or PPL_PROTOCOL}.", ""]
    lines += [
        f"Documents: {docs.read} read, {docs.too_short} skipped as shorter than {docs.min_tokens} "
        f"tokens, {docs.evaluated} evaluated. Cells: ppl [95 % CI] (documents); † beyond the model's context.",
        "",
        "### By evaluation length",
        "",
    ]
    if first.document_set == "common":
        lines += [
            f"Every length is scored on the same {docs.common} documents (those reaching "
            f"{first.bucket_length} tokens), so changes across lengths are the model's.",
            "",
        ]
    lines += ppl_length_table(models)
    lines += ppl_all_documents_markdown(models)
    short = short_context_table(models)
    if short:
        lines += ["### Short-context regression (perplexity at the original context)", "", *short]
    buckets = bucket_table(models)
    if buckets:
        lines += [f"### By token position (documents reaching {first.bucket_length} tokens)", ""]
        if "ppl_by_position" in plots:
            lines += [f"![perplexity by position]({plots['ppl_by_position']})", ""]
        lines += buckets
    cu_models = [m for m in raw["models"] if (m.get("perplexity") or {}).get("context_use")]
    if cu_models:
        lines += _context_use_markdown(cu_models, plots)
    return lines


def _context_use_markdown(cu_models: list[dict[str, Any]], plots: dict[str, str]) -> list[str]:
    t = cu_models[0]["perplexity"]["context_use"]["targets"]
    lines = [
        "### Context use",
        "",
        f"The same target tokens (positions {t['start']}–{t['end']} of {t['documents']} documents) scored with "
        "their context cut to k tokens (windows of k moved by k/2: each target sees k/2 to k tokens). "
        "Gain = NLL(k) − NLL(full) in nats/token [95 % paired bootstrap CI]; > 0 means the far context helps. "
        "At k = the original window, a gain whose interval is above 0 means the model uses context beyond "
        "its original window.",
        "",
    ]
    if "context_use" in plots:
        lines += [f"![context use]({plots['context_use']})", ""]
    limits = sorted({e["context"] for m in cu_models for e in m["perplexity"]["context_use"]["limits"]})
    rows = []
    originals = {m["perplexity"]["context_use"].get("original_window") for m in cu_models}
    for k in limits:
        row = [f"{k} (original window)" if k in originals else str(k)]
        for m in cu_models:
            e = next((x for x in m["perplexity"]["context_use"]["limits"] if x["context"] == k), None)
            row.append("–" if e is None else _gain_cell(e))
        rows.append(row)
    rows.append(["full"] + [_ppl_dict_cell(m["perplexity"]["context_use"]["full"]) for m in cu_models])
    lines += table(["context k"] + [m["name"] for m in cu_models], rows)
    return lines


def _ppl_dict_cell(e: dict[str, Any] | None) -> str:
    if not e or e.get("ppl") is None:
        return "–"
    return f"{fmt(e['ppl'])} [{fmt(e.get('ci_low'))}, {fmt(e.get('ci_high'))}] ({e.get('documents')})"


def _gain_cell(e: dict[str, Any]) -> str:
    low, high = num_text(e["gain_nll_ci_low"], "+.4f"), num_text(e["gain_nll_ci_high"], "+.4f")
    gain = f"{num_text(e['gain_nll'], '+.4f')} [{low}, {high}]"
    return f"{fmt(e['ppl'])}; gain {gain}"


def _ps(row: dict[str, Any]) -> list[str]:
    return [p_text(row["p_value"]), p_text(row["p_holm"])]


def _ratio_cell(r: dict[str, Any]) -> str:
    low, high = r.get("ci_low"), r.get("ci_high")
    if low is None or high is None or not math.isfinite(low):
        return f"{num_text(r['ratio'], '.3f')}× [–]"
    mark = "" if low <= 1 <= high else " **"
    return f"{num_text(r['ratio'], '.3f')}× [{low:.3f}, {high:.3f}]{mark}"


def comparisons_markdown(comp: dict[str, Any]) -> list[str]:
    """The paired model-vs-reference tables (perplexity ratios, McNemar tests on retrieval grids).

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
    ppl = comp.get("perplexity") or []
    by_len = [r for r in ppl if r["view"] == "length"]
    if by_len:
        lines += [
            "### Perplexity ratio by length",
            "",
            f"ppl(model) / ppl({ref}) on the same tokens of the same documents, with a 95 % paired bootstrap "
            "interval (documents resampled jointly); ** the interval excludes 1.",
            "",
        ]
        rows = [
            [
                r["model"],
                str(r["length"]),
                _ratio_cell(r),
                str(r["documents"]),
                p_text(r["p_value"]),
                p_text(r["p_holm"]),
            ]
            for r in by_len
        ]
        lines += table(["model", "length", "ratio [95 % CI]", "docs", "p", "p Holm"], rows)
    by_bucket = [r for r in ppl if r["view"] == "bucket"]
    if by_bucket:
        models = list(dict.fromkeys(r["model"] for r in by_bucket))
        edges = list(dict.fromkeys((r["start"], r["end"]) for r in by_bucket))
        lines += ["### Perplexity ratio by token position", "", f"ppl(model) / ppl({ref}) per position bucket.", ""]
        rows = []
        for start, end in edges:
            row = [f"{start}–{end}"]
            for name in models:
                r = next((x for x in by_bucket if x["model"] == name and x["start"] == start), None)
                row.append("–" if r is None else _ratio_cell(r))
            rows.append(row)
        lines += table(["positions"] + models, rows)
    grids = comp.get("grids") or []
    if grids:
        lines += [
            "### Retrieval, paired trials (exact McNemar)",
            "",
            f"Same prompts for both models; only the discordant trials carry evidence: model right / {ref} wrong, "
            "and the reverse.",
            "",
        ]
        rows = [
            [
                r["model"],
                r["task"],
                str(r["length"]),
                f"{r['a_correct']}/{r['trials']}",
                f"{r['b_correct']}/{r['trials']}",
                f"{r['only_a']} / {r['only_b']}",
                f"{num_text(r['difference'], '+.0f', 100)} pts",
                p_text(r["p_value"]),
                p_text(r["p_holm"]),
            ]
            for r in grids
        ]
        lines += table(
            ["model", "task", "length", "model correct", f"{ref} correct", "discordant (+ / −)", "Δ", "p", "p Holm"],
            rows,
        )
    from ctxext.evaluation.sections import SECTIONS

    for key, registered in SECTIONS.items():
        if comp.get(key):
            lines += registered.paired_markdown(comp[key], ref)
    for note in comp.get("notes") or []:
        lines += [f"Note: {note}", ""]
    return lines


def ppl_all_documents_markdown(models: list[ModelEntry]) -> list[str]:
    """The secondary perplexity table: at each length, every document with at least that many tokens.

    Args:
        models: model entries with a ``perplexity`` section.

    Returns:
        Markdown lines (none when no model has the view, or when it equals the main table).
    """
    have = [(m.name, m.perplexity) for m in models if m.perplexity and m.perplexity.by_length_all]
    if not have:
        return []
    lengths = sorted({int(L) for _, p in have for L in p.by_length_all})
    rows = []
    differs = False
    for L in lengths:
        row = [str(L)]
        for _, p in have:
            e, main = p.by_length_all.get(str(L)), p.by_length.get(str(L))
            differs |= e is not None and e.documents != (main.documents if main else None)
            row.append(ppl_cell(e))
        rows.append(row)
    if not differs:
        return []
    return [
        "#### All documents with at least L tokens (secondary view)",
        "",
        "A different document set at each length (more documents at short lengths): do not read a change "
        "across lengths in this table as the model's.",
        "",
        *table(["length"] + [name for name, _ in have], rows),
    ]


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
