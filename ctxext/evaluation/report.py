"""Evaluation reports: ``report.json`` (stable schema), ``report.md`` and PNG plots, models side by side.

``report.json`` schema (``"schema": "ctxext.eval.report/v1"``; fields are only added, never renamed)::

    {
      "schema": "ctxext.eval.report/v1", "ctxext_version": str, "created": ISO-8601 UTC,
      "suite": {name, path, ...} | null, "command": str | null,
      "environment": {"python", "torch", "transformers", "peft", "device"},
      "data": {"perplexity": {source, text_field, split, note?}, "needle": {...}, "qa": {...}},
      "models": [
        {
          "name": str,                                   # report label
          "model": {ref, base, base_path, adapter, config_from, dtype, device, attention, parameters, rope_verified},
          "rope": {rope_type, rope_theta, original_length, current_length, factor, rotary_dim, parameters, ...},
          "perplexity": {                                 # present when the ppl task ran
            "protocol": str, "mode": "one-pass" | "per-length" | "sliding",
            "document_set": "common",                      # every length on the documents reaching the longest
            "by_length": {"<L>": {ppl, nll, tokens, documents, ci_low, ci_high, beyond_context}},
            "by_length_all": {"<L>": {...}},               # secondary view: all documents with >= L tokens
            "per_document": {keys, by_length, by_length_all, buckets},   # per-document NLL sums for pairing
            "by_bucket": [{start, end, ppl, nll, tokens, documents, ci_low, ci_high}],   # start incl., end excl.
            "bucket_length": int, "bucket_documents": int,
            "short_context": {length, ppl, nll, tokens, documents, ci_low, ci_high},   # at the original length
            "context_use": {targets: {start, end, tokens_per_document, documents}, full: {ppl, ...},
                            limits: [{context, stride, ppl, nll, tokens, documents, ci_low, ci_high,
                                      gain_nll, gain_nll_ci_low, gain_nll_ci_high, ppl_ratio}]},
            "documents": {read, too_short, min_tokens, evaluated, per_length: {"<L>": n}},
            "settings": {...}, "forward_passes": int, "tokens_processed": int, "seconds": float
          },
          "passkey" / "needle": {
            "cells": [{length, depth, trials, correct, accuracy, score, ci_low, ci_high, beyond_context, examples}],
            "by_length": {"<L>": {correct, trials, accuracy, ci_low, ci_high}}, "by_depth": {...}, "overall": {...},
            "settings": {...}, "prompt": {...}, "seconds": float
          },
          "attention": {length, documents, original_length, beyond_context, band_labels, queries,
                        layers: [{layer, bands: [share per band], beyond_original, sinks, entropy,
                                  entropy_by_position: [nats per bucket]}],
                        mean: {bands, beyond_original, sinks, entropy}, position_buckets, settings, seconds},
          "qa": {examples, truncated, prompt_budget, overall: {examples, exact_match, f1, exact_match_ci, f1_ci},
                 by_position: {"0-20%": {...}, ..., "not found": {...}}, by_length: {"0-4000": {...}, ...},
                 samples, settings, seconds}
        }
      ],
      "comparisons": {...} | null     # paired model-vs-reference statistics, see ctxext.evaluation.paired
    }

``nll`` is the mean negative log-likelihood in nats per token, ``ppl = exp(nll)``; ``ci_low`` / ``ci_high``
bound the perplexity (95 % bootstrap over documents); accuracies carry 95 % Wilson intervals; EM / F1 are
percentages with 95 % bootstrap intervals over examples.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import platform
from pathlib import Path
from typing import Any

from ctxext.atomic import atomic_folder

# The kind of output folder a report is (``ctxext.atomic``): --overwrite replaces only another report.
REPORT_KIND = "report"

SCHEMA = "ctxext.eval.report/v1"
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
        The report dict (see the module docstring for the schema).
    """
    from ctxext import __version__
    from ctxext.evaluation.paired import compare_models

    for m in models:
        ppl = m.get("perplexity")
        if ppl and "protocol" not in ppl:
            ppl["protocol"] = SLIDING_PROTOCOL if ppl.get("mode") == "sliding" else PPL_PROTOCOL
    return {
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


def write_report(report: dict[str, Any], out: str | Path, overwrite: bool = False) -> Path:
    """Write ``report.json``, ``report.md`` and the PNG plots into ``out``, atomically.

    Everything is written to a temporary folder next to ``out`` first and then moved in place, so an
    interrupted run never leaves a report that looks complete.

    Args:
        report: from :func:`build_report`.
        out: the output folder (created). An existing non-empty folder is refused unless ``overwrite``,
            and even then replaced only when it is a report folder ctxext wrote (see
            :func:`ctxext.atomic.check_output`).
        overwrite: replace a previous report folder.

    Returns:
        The output folder.

    Raises:
        InputError: ``out`` cannot be written without losing files ctxext did not write.
    """
    out = Path(out)
    with atomic_folder(out, kind=REPORT_KIND, overwrite=overwrite) as tmp:
        plots = write_plots(report, tmp)
        (tmp / "report.md").write_text(render_markdown(report, plots))
        (tmp / "report.json").write_text(json.dumps(_clean(report), indent=2, allow_nan=False) + "\n")
    return out


def _clean(obj: Any) -> Any:
    # JSON has no NaN / inf: they become null.
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):
        return _clean(obj.item())
    return obj


# ---------------------------------------------------------------------------------------------
# Markdown
# ---------------------------------------------------------------------------------------------


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.3e}"


def _ppl_cell(e: dict[str, Any] | None) -> str:
    if not e or e.get("ppl") is None:
        return "–"
    mark = " †" if e.get("beyond_context") else ""
    return f"{_fmt(e['ppl'])} [{_fmt(e['ci_low'])}, {_fmt(e['ci_high'])}] ({e['documents']}){mark}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def render_markdown(report: dict[str, Any], plots: dict[str, str] | None = None) -> str:
    """``report.md``: models, perplexity by length / bucket / context limit, short-context regression, grids, QA.

    Args:
        report: the report dict.
        plots: plot name → file name, embedded as images.

    Returns:
        Markdown text.
    """
    plots = plots or {}
    models = report["models"]
    names = [m["name"] for m in models]
    lines = ["# ctxext evaluation report", ""]
    if report.get("suite"):
        lines += [f"Suite: `{report['suite'].get('name')}` ({report['suite'].get('path')})", ""]
    lines += [
        f"Created {report['created']} with ctxext {report['ctxext_version']} on {report['environment']['device']}.",
        "",
    ]
    lines += ["## Models", ""]
    rows = []
    for m in models:
        r, info = m["rope"], m["model"]
        rows.append(
            [
                m["name"],
                f"`{info.get('base') or info.get('ref')}`",
                f"`{info['adapter']}`" if info.get("adapter") else "–",
                r["rope_type"],
                _fmt(r.get("factor")),
                f"{r['rope_theta']:g}",
                str(r["original_length"]),
                str(r["current_length"]),
                "✓" if info.get("rope_verified") else "not checked",
            ]
        )
    lines += _table(["model", "base", "adapter", "rope", "factor", "θ", "original ctx", "context", "RoPE check"], rows)
    lines += beyond_target_markdown(report)

    ppl_models = [m for m in models if m.get("perplexity")]
    if ppl_models:
        lines += _ppl_markdown(ppl_models, report, plots)
    for task, title in (("passkey", "Passkey retrieval"), ("needle", "Needle in a haystack")):
        grid_models = [m for m in models if m.get(task)]
        if grid_models:
            lines += _grid_markdown(grid_models, task, title, plots)
    ruler_models = [m for m in models if m.get("ruler")]
    if ruler_models:
        lines += _ruler_markdown(ruler_models, plots)
    qa_models = [m for m in models if m.get("qa")]
    if qa_models:
        lines += _qa_markdown(qa_models, plots)
    attn_models = [m for m in models if m.get("attention")]
    if attn_models:
        lines += attention_markdown(attn_models, plots)
    from ctxext.evaluation.sections import SECTIONS  # sections registered as plugins render themselves

    for key, registered in SECTIONS.items():
        if any(m.get(key) for m in models):
            lines += registered.markdown([m for m in models if m.get(key)], report)
    if report.get("comparisons") and (report["comparisons"]["comparisons"] or report["comparisons"]["notes"]):
        lines += comparisons_markdown(report["comparisons"])
    lines += [
        "---",
        f"Models: {', '.join(names)}. Intervals are 95 %: bootstrap over documents for perplexities, Wilson for "
        "accuracies, bootstrap over examples for EM / F1. These per-model intervals are unpaired: to compare "
        "models, read the paired comparisons (same documents, same trials), not whether intervals overlap.",
        "",
    ]
    return "\n".join(lines)


def _ppl_markdown(models: list[dict[str, Any]], report: dict[str, Any], plots: dict[str, str]) -> list[str]:
    names = [m["name"] for m in models]
    first = models[0]["perplexity"]
    data = (report.get("data") or {}).get("perplexity", {})
    lines = ["## Perplexity", ""]
    lines += [f"Data: `{data.get('source', '?')}`. Protocol: {first.get('protocol', PPL_PROTOCOL)}.", ""]
    docs = first.get("documents", {})
    lines += [
        f"Documents: {docs.get('read')} read, {docs.get('too_short')} skipped as shorter than {docs.get('min_tokens')} "
        f"tokens, {docs.get('evaluated')} evaluated. Cells: ppl [95 % CI] (documents); † beyond the model's context.",
        "",
        "### By evaluation length",
        "",
        *_common_set_line(docs, first),
    ]
    lengths = sorted({int(L) for m in models for L in m["perplexity"]["by_length"]})
    rows = [[str(L)] + [_ppl_cell(m["perplexity"]["by_length"].get(str(L))) for m in models] for L in lengths]
    lines += _table(["length"] + names, rows)
    lines += ppl_all_documents_markdown(models)
    short = [(m["name"], m["perplexity"].get("short_context")) for m in models if m["perplexity"].get("short_context")]
    if short:
        lines += ["### Short-context regression (perplexity at the original context)", ""]
        ref = short[0][1]
        rows = []
        for name, s in short:
            delta = (s["ppl"] / ref["ppl"] - 1) * 100 if ref.get("ppl") and s.get("ppl") else None
            rows.append([name, str(s["length"]), _ppl_cell(s), "–" if delta is None else f"{delta:+.2f} %"])
        lines += _table(["model", "length", "ppl [95 % CI] (docs)", f"vs {short[0][0]}"], rows)
    if any(m["perplexity"].get("by_bucket") for m in models):
        lines += [f"### By token position (documents reaching {first.get('bucket_length')} tokens)", ""]
        if "ppl_by_position" in plots:
            lines += [f"![perplexity by position]({plots['ppl_by_position']})", ""]
        buckets = max((m["perplexity"].get("by_bucket") or [] for m in models), key=len)
        rows = []
        for i, b in enumerate(buckets):
            cells = []
            for m in models:
                bb = m["perplexity"].get("by_bucket") or []
                cells.append(_ppl_cell(bb[i]) if i < len(bb) else "–")
            rows.append([f"{b['start']}–{b['end']}"] + cells)
        lines += _table(["positions"] + names, rows)
    cu_models = [m for m in models if m["perplexity"].get("context_use")]
    if cu_models:
        t = cu_models[0]["perplexity"]["context_use"]["targets"]
        lines += [
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
        rows.append(["full"] + [_ppl_cell(m["perplexity"]["context_use"]["full"]) for m in cu_models])
        lines += _table(["context k"] + [m["name"] for m in cu_models], rows)
    return lines


def _gain_cell(e: dict[str, Any]) -> str:
    gain = f"{e['gain_nll']:+.4f} [{e['gain_nll_ci_low']:+.4f}, {e['gain_nll_ci_high']:+.4f}]"
    return f"{_fmt(e['ppl'])}; gain {gain}"


def _grid_markdown(models: list[dict[str, Any]], task: str, title: str, plots: dict[str, str]) -> list[str]:
    lines = [f"## {title}", ""]
    if task in plots:
        lines += [f"![{task}]({plots[task]})", ""]
    lines += [_scoring_note(models, task), ""]
    for m in models:
        res = m[task]
        depths = sorted({c["depth"] for c in res["cells"]})
        lengths = sorted({c["length"] for c in res["cells"]})
        ov = res["overall"]
        lines += [
            f"**{m['name']}**: overall {ov['accuracy'] * 100:.1f} % "
            f"[{ov['ci_low'] * 100:.1f}, {ov['ci_high'] * 100:.1f}] ({ov['trials']} trials). "
            "Cells: accuracy % (trials).",
            "",
        ]
        rows = []
        for L in lengths:
            row = [str(L)]
            for d in depths:
                c = next(c for c in res["cells"] if c["length"] == L and c["depth"] == d)
                row.append(f"{c['accuracy'] * 100:.0f} ({c['trials']}){' †' if c.get('beyond_context') else ''}")
            bl = res["by_length"][str(L)]
            row.append(f"{bl['accuracy'] * 100:.0f} [{bl['ci_low'] * 100:.0f}, {bl['ci_high'] * 100:.0f}]")
            rows.append(row)
        lines += _table(["length \\ depth %"] + [f"{d:g}" for d in depths] + ["all [95 % CI]"], rows)
    return lines


SCORING_NOTES = {
    "teacher-forced": "teacher-forced (one forward pass over prompt + answer; correct iff every answer token is the "
    "argmax — exact for greedy decoding; no KV cache, no generation config)",
    "generate": "generation (explicit greedy config; KV cache off for dynamic / longrope; correct iff the generated "
    "tokens start with the answer's)",
}


def _scoring_note(models: list[dict[str, Any]], task: str) -> str:
    """One line naming how a retrieval section was scored (reports before scoring modes: generation)."""
    kinds = sorted({m[task].get("scoring", "generate (legacy: first number / word recall)") for m in models})
    return "Scoring: " + "; ".join(SCORING_NOTES.get(k, k) for k in kinds) + ". Prompt + answer fit the length."


def _ruler_markdown(models: list[dict[str, Any]], plots: dict[str, str]) -> list[str]:
    """The RULER-style section: score by task × length per model, and effective lengths side by side."""
    first = models[0]["ruler"]
    st = first["settings"]
    ref = (
        f"{st['threshold'] * 100:g} % of the model's own score at its original length"
        if st["threshold_reference"] == "original"
        else f"an absolute {st['threshold'] * 100:g} %"
    )
    lines = ["## RULER-style tasks", ""]
    if "ruler" in plots:
        lines += [f"![ruler]({plots['ruler']})", ""]
    lines += [
        f"Haystack: `{first['haystack']}`; depths {', '.join(f'{d:g}' for d in st['depths'])} %; {st['trials']} trials "
        f"per cell; templates: {st['templates']}. {_scoring_note([{'r': first}], 'r')} Effective length: the longest "
        f"length up to which every evaluated length scores ≥ {ref} (RULER); n/a: the task scores below "
        f"{st.get('min_reference', 0) * 100:g} % at the original length, so it has no relative threshold. Cells: "
        "accuracy % over all depths (trials); ✱ the model was fine-tuned on this task; † beyond the model's context.",
        "",
    ]
    names = [m["name"] for m in models]
    tasks = list(first["tasks"])
    rows = []
    for t in tasks:
        row = [t]
        for m in models:
            e = m["ruler"]["tasks"].get(t, {}).get("effective_length", {})
            trained = t in (m["ruler"].get("trained_tasks") or []) or (
                m["ruler"]["tasks"].get(t, {}).get("registry_task") in (m["ruler"].get("trained_tasks") or [])
            )
            row.append(_eff(e) + (" ✱" if trained else ""))
        rows.append(row)
    rows.append(
        ["**overall** (mean over the tasks with a reference)"] + [_eff(m["ruler"]["effective_length"]) for m in models]
    )
    lines += ["### Effective length", ""]
    lines += _table(["task"] + names, rows)
    for m in models:
        r = m["ruler"]
        lengths = [str(L) for L in r["settings"]["lengths"]]
        lines += [f"### {m['name']}", ""]
        body = []
        for t, res in r["tasks"].items():
            row = [t + (" ✱" if res.get("registry_task") in (r.get("trained_tasks") or []) else "")]
            for L in lengths:
                bl = res["by_length"].get(L)
                cell = next((c for c in res["cells"] if str(c["length"]) == L), {})
                row.append(
                    "–"
                    if bl is None
                    else f"{bl['accuracy'] * 100:.0f} ({bl['trials']}){' †' if cell.get('beyond_context') else ''}"
                )
            body.append(row)
        counted = ", ".join(r["effective_length"].get("tasks") or []) or "none"
        body.append([f"**mean** ({counted})"] + [f"{r['mean_by_length'][L] * 100:.0f}" for L in lengths])
        header = [f"{L}{' (orig.)' if int(L) == r['original_length'] else ''}" for L in lengths]
        lines += _table(["task \\ length", *header], body)
    return lines


def _eff(e: dict[str, Any]) -> str:
    if not e:
        return "–"
    bar = e.get("threshold")
    if e.get("length") is None:
        if bar is None:
            ref = e.get("reference_score")
            return "n/a" + (f" ({ref * 100:.0f} % at the original length)" if ref is not None else "")
        return f"< shortest (≥ {bar * 100:.0f} % needed)"
    return f"{e['length']} (≥ {bar * 100:.0f} %)"


def _qa_markdown(models: list[dict[str, Any]], plots: dict[str, str]) -> list[str]:
    names = [m["name"] for m in models]
    lines = ["## Long-document QA", ""]
    if "qa" in plots:
        lines += [f"![qa by bucket]({plots['qa']})", ""]

    def cell(s: dict[str, Any] | None) -> str:
        if not s or s.get("f1") is None:
            return "–"
        return f"EM {s['exact_match']:.1f} / F1 {s['f1']:.1f} ({s['examples']})"

    rows = [["overall"] + [cell(m["qa"]["overall"]) for m in models]]
    rows.append(["truncated (middle)"] + [f"{m['qa']['truncated']} of {m['qa']['examples']}" for m in models])
    for key, label in (("by_position", "answer at"), ("by_length", "context tokens")):
        buckets: list[str] = []
        for m in models:
            buckets += [b for b in m["qa"][key] if b not in buckets]
        for b in buckets:
            # "answer truncated away" (cut out by the middle truncation) reads on its own.
            name = b if b.startswith("answer") else f"{label} {b}"
            rows.append([name] + [cell(m["qa"][key].get(b)) for m in models])
    lines += _table(["bucket"] + names, rows)
    return lines


# ---------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------


def write_plots(report: dict[str, Any], folder: Path) -> dict[str, str]:
    """Write the PNG plots that the report's data supports.

    Args:
        report: the report dict.
        folder: where to write.

    Returns:
        Plot name → file name.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = report["models"]
    written: dict[str, str] = {}

    ppl = [m for m in models if m.get("perplexity", {}).get("by_bucket")]
    if ppl:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in ppl:
            bb = m["perplexity"]["by_bucket"]
            x = [(b["start"] + b["end"]) / 2 for b in bb]
            ax.plot(x, [b["ppl"] for b in bb], marker="o", label=m["name"])
            ax.fill_between(x, [b["ci_low"] for b in bb], [b["ci_high"] for b in bb], alpha=0.2)
        for m in ppl:
            ax.axvline(m["rope"]["original_length"], color="grey", linestyle=":", linewidth=1)
        ax.set_xlabel("token position (bucket centre)")
        ax.set_ylabel("perplexity")
        ax.set_yscale("log")
        ax.set_title("Perplexity by position (95 % CI; dotted: original context)")
        ax.legend()
        written["ppl_by_position"] = _save(fig, folder, "ppl_by_position.png")

    by_len = [m for m in models if m.get("perplexity", {}).get("by_length")]
    if by_len:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in by_len:
            items = sorted(
                ((int(L), e) for L, e in m["perplexity"]["by_length"].items() if e.get("ppl")), key=lambda t: t[0]
            )
            x = [L for L, _ in items]
            ax.plot(x, [e["ppl"] for _, e in items], marker="o", label=m["name"])
            ax.fill_between(x, [e["ci_low"] for _, e in items], [e["ci_high"] for _, e in items], alpha=0.2)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("evaluation length (tokens)")
        ax.set_ylabel("perplexity")
        ax.set_title("Perplexity by evaluation length (95 % CI)")
        ax.legend()
        written["ppl_by_length"] = _save(fig, folder, "ppl_by_length.png")

    cu = [m for m in models if m.get("perplexity", {}).get("context_use")]
    if cu:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for m in cu:
            c = m["perplexity"]["context_use"]
            lim = c["limits"]
            (line,) = ax.plot([e["context"] for e in lim], [e["ppl"] for e in lim], marker="o", label=m["name"])
            ax.axhline(c["full"]["ppl"], color=line.get_color(), linestyle="--", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context limit k (tokens)")
        ax.set_ylabel("perplexity of the same target tokens")
        ax.set_title("Context use (dashed: full context)")
        ax.legend()
        written["context_use"] = _save(fig, folder, "context_use.png")

    for task in ("passkey", "needle"):
        grid = [m for m in models if m.get(task)]
        if grid:
            written[task] = _heatmap(plt, grid, task, folder)
    ruler = [m for m in models if m.get("ruler")]
    if ruler:
        written["ruler"] = _ruler_heatmap(plt, ruler, folder)

    qa = [m for m in models if m.get("qa")]
    if qa:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, key, title in ((axes[0], "by_position", "answer position"), (axes[1], "by_length", "context length")):
            labels: list[str] = []
            for m in qa:
                labels += [b for b in m["qa"][key] if b not in labels]
            width = 0.8 / len(qa)
            for i, m in enumerate(qa):
                vals = [(m["qa"][key].get(b) or {}).get("f1") or 0.0 for b in labels]
                ax.bar([j + i * width for j in range(len(labels))], vals, width=width, label=m["name"])
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=30)
            ax.set_ylim(0, 100)
            ax.set_ylabel("F1 (%)")
            ax.set_title(f"QA F1 by {title}")
        axes[0].legend()
        written["qa"] = _save(fig, folder, "qa_by_bucket.png")
    written.update(attention_plot(plt, models, folder))
    return written


def _heatmap(plt: Any, models: list[dict[str, Any]], task: str, folder: Path) -> str:
    import numpy as np

    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models) + 1, 4), squeeze=False, constrained_layout=True)
    image = None
    for ax, m in zip(axes[0], models, strict=True):
        cells = m[task]["cells"]
        lengths = sorted({c["length"] for c in cells})
        depths = sorted({c["depth"] for c in cells})
        grid = np.full((len(depths), len(lengths)), np.nan)
        for c in cells:
            grid[depths.index(c["depth"]), lengths.index(c["length"])] = c["accuracy"]
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("depth (%)")
        ax.set_title(m["name"])
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    fig.suptitle("Passkey retrieval" if task == "passkey" else "Needle in a haystack")
    return _save(fig, folder, f"{task}_heatmap.png", tight=False)


def _ruler_heatmap(plt: Any, models: list[dict[str, Any]], folder: Path) -> str:
    """Tasks × lengths accuracy per model, the effective length of each task marked by a black frame."""
    import numpy as np
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(
        1, len(models), figsize=(3.2 * len(models) + 2, 0.45 * len(models[0]["ruler"]["tasks"]) + 2.2), squeeze=False,
        constrained_layout=True,
    )
    image = None
    for ax, m in zip(axes[0], models, strict=True):
        r = m["ruler"]
        tasks = list(r["tasks"])
        lengths = [str(L) for L in r["settings"]["lengths"]]
        grid = np.array([[r["scores"][t].get(L, np.nan) for L in lengths] for t in tasks], dtype=float)
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        for i, t in enumerate(tasks):
            eff = r["tasks"][t]["effective_length"].get("length")
            if eff is not None and str(eff) in lengths:
                j = lengths.index(str(eff))
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=2))
            for j in range(len(lengths)):
                ax.text(j, i, f"{grid[i, j] * 100:.0f}", ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(lengths)), lengths, rotation=45)
        ax.set_yticks(range(len(tasks)), tasks)
        ax.set_xlabel("length (tokens)")
        ax.set_title(m["name"])
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    fig.suptitle("RULER-style tasks (frame: effective length)")
    return _save(fig, folder, "ruler_heatmap.png", tight=False)


def _save(fig: Any, folder: Path, name: str, tight: bool = True) -> str:
    import matplotlib.pyplot as plt

    if tight:
        fig.tight_layout()
    fig.savefig(folder / name, dpi=110)
    plt.close(fig)
    return name


def _p(p: float | None) -> str:
    if p is None or not math.isfinite(p):
        return "–"
    return f"{p:.2g}" if p >= 0.001 else "<0.001"


def _ratio_cell(r: dict[str, Any]) -> str:
    real = r.get("ci_low") is not None and math.isfinite(r["ci_low"]) and not r["ci_low"] <= 1 <= r["ci_high"]
    mark = " **" if real else ""
    if not real and not (r.get("ci_low") is not None and math.isfinite(r["ci_low"])):
        return f"{r['ratio']:.3f}× [–]"
    return f"{r['ratio']:.3f}× [{r['ci_low']:.3f}, {r['ci_high']:.3f}]{mark}"


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
            [r["model"], str(r["length"]), _ratio_cell(r), str(r["documents"]), _p(r["p_value"]), _p(r["p_holm"])]
            for r in by_len
        ]
        lines += _table(["model", "length", "ratio [95 % CI]", "docs", "p", "p Holm"], rows)
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
        lines += _table(["positions"] + models, rows)
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
                f"{r['difference'] * 100:+.0f} pts",
                _p(r["p_value"]),
                _p(r["p_holm"]),
            ]
            for r in grids
        ]
        lines += _table(
            ["model", "task", "length", "model correct", f"{ref} correct", "discordant (+ / −)", "Δ", "p", "p Holm"],
            rows,
        )
    attn = comp.get("attention") or []
    if attn:
        lines += [
            "### Attention beyond the original window, paired documents",
            "",
            f"Share of attention on keys beyond the original window (mean over layers), model − {ref}, in "
            "percentage points [95 % paired bootstrap CI over documents].",
            "",
        ]
        rows = [
            [
                r["model"],
                str(r["length"]),
                f"{r['difference'] * 100:+.1f} [{r['ci_low'] * 100:+.1f}, {r['ci_high'] * 100:+.1f}]",
                str(r["documents"]),
                _p(r["p_value"]),
                _p(r["p_holm"]),
            ]
            for r in attn
        ]
        lines += _table(["model", "length", "Δ share (pts)", "docs", "p", "p Holm"], rows)
    for note in comp.get("notes") or []:
        lines += [f"Note: {note}", ""]
    return lines


def ppl_all_documents_markdown(models: list[dict[str, Any]]) -> list[str]:
    """The secondary perplexity table: at each length, every document with at least that many tokens.

    Args:
        models: model entries with a ``perplexity`` section.

    Returns:
        Markdown lines (none when no model has the view, or when it equals the main table).
    """
    have = [m for m in models if m["perplexity"].get("by_length_all")]
    if not have:
        return []
    lengths = sorted({int(L) for m in have for L in m["perplexity"]["by_length_all"]})
    rows = []
    differs = False
    for L in lengths:
        row = [str(L)]
        for m in have:
            e = m["perplexity"]["by_length_all"].get(str(L))
            differs |= bool(e) and e.get("documents") != (m["perplexity"]["by_length"].get(str(L)) or {}).get(
                "documents"
            )
            row.append(_ppl_cell(e))
        rows.append(row)
    if not differs:
        return []
    return [
        "#### All documents with at least L tokens (secondary view)",
        "",
        "A different document set at each length (more documents at short lengths): do not read a change "
        "across lengths in this table as the model's.",
        "",
        *_table(["length"] + [m["name"] for m in have], rows),
    ]


def _common_set_line(docs: dict[str, Any], ppl: dict[str, Any]) -> list[str]:
    if ppl.get("document_set") != "common":
        return []
    return [
        f"Every length is scored on the same {docs.get('common')} documents (those reaching "
        f"{ppl.get('bucket_length')} tokens), so changes across lengths are the model's.",
        "",
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


def attention_markdown(models: list[dict[str, Any]], plots: dict[str, str]) -> list[str]:
    """The attention-diagnostics section: per model and layer, mass by distance band, beyond the window, sinks.

    Args:
        models: model entries with an ``attention`` section.
        plots: plot name → file name.

    Returns:
        Markdown lines.
    """
    first = models[0]["attention"]
    lines = [
        "## Attention diagnostics",
        "",
        f"Per layer, averaged over heads and {first['documents']} documents of {first['length']} tokens: the share "
        "of attention mass by query–key distance (as a fraction of the length), on keys beyond the model's "
        f"original window, and on the first {first['settings']['sink_tokens']} tokens (sinks), for queries in the "
        "second half of the sequence; entropy (nats) over all queries. Recomputed from each layer's q and k "
        "with the model's own rotary embedding.",
        "",
    ]
    if "attention" in plots:
        lines += [f"![attention diagnostics]({plots['attention']})", ""]
    labels = first["band_labels"]
    rows = []
    for m in models:
        a = m["attention"]
        mark = " †" if a.get("beyond_context") else ""
        for lay in [*a["layers"], {"layer": "mean", **a["mean"]}]:
            rows.append(
                [
                    f"{m['name']}{mark}",
                    str(lay["layer"]),
                    *[f"{x * 100:.1f}" for x in lay["bands"]],
                    f"{lay['beyond_original'] * 100:.1f} (> {a['original_length']})",
                    f"{lay['sinks'] * 100:.1f}",
                    f"{lay['entropy']:.2f}",
                ]
            )
    lines += _table(["model", "layer", *[f"d {x} of L" for x in labels], "beyond window %", "sinks %", "entropy"], rows)
    return lines


def attention_plot(plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
    """``attention.png``: mass beyond the original window per layer, and entropy by query position.

    Args:
        plt: ``matplotlib.pyplot``.
        models: report model entries (those without ``attention`` are skipped).
        folder: where to write.

    Returns:
        ``{"attention": file name}``, or empty without attention sections.
    """
    have = [m for m in models if m.get("attention")]
    if not have:
        return {}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    width = 0.8 / len(have)
    for i, m in enumerate(have):
        a = m["attention"]
        layers = [lay["layer"] for lay in a["layers"]]
        axes[0].bar(
            [x + i * width for x in layers],
            [lay["beyond_original"] * 100 for lay in a["layers"]],
            width=width,
            label=m["name"],
        )
        bottom = 0.0
        for b, (label, share) in enumerate(zip(a["band_labels"], a["mean"]["bands"], strict=True)):
            axes[1].bar(
                i,
                share * 100,
                bottom=bottom,
                color=plt.cm.viridis(b / max(1, len(a["band_labels"]) - 1)),
                label=label if i == 0 else None,
            )
            bottom += share * 100
        centres = [(s + e) / 2 for s, e in a["position_buckets"]]
        mean_ent = [
            sum(col) / len(col) for col in zip(*[lay["entropy_by_position"] for lay in a["layers"]], strict=True)
        ]
        axes[2].plot(centres, mean_ent, marker="o", label=m["name"])
    n_layers = max(len(m["attention"]["layers"]) for m in have)
    axes[0].set_xticks([x + 0.4 - width / 2 for x in range(n_layers)], [str(x) for x in range(n_layers)])
    axes[0].set_xlabel("layer")
    axes[0].set_ylabel("% of attention mass")
    axes[0].set_title(f"Beyond the original window ({have[0]['attention']['original_length']} tokens)")
    axes[0].legend()
    axes[1].set_xticks(range(len(have)), [m["name"] for m in have])
    axes[1].set_ylabel("% of attention mass (mean over layers)")
    axes[1].set_title("By query–key distance (share of length)")
    axes[1].legend(fontsize=8)
    axes[2].set_xlabel("query position (bucket centre)")
    axes[2].set_ylabel("entropy (nats, mean over layers)")
    axes[2].set_title("Attention entropy by position")
    axes[2].legend()
    return {"attention": _save(fig, folder, "attention.png")}
