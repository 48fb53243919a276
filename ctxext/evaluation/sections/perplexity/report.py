"""The ``perplexity`` section's part of ``report.md`` and of the model card, and its console lines.

Every function reads the report's JSON form (model entries holding a ``perplexity`` part, typed here with
:class:`~ctxext.evaluation.sections.perplexity.schema.Perplexity`); the card's tables are ``report.md``'s, so the
two read alike. Cells: ``ppl [95 % CI] (documents)``, † beyond the model's configured context.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.artifacts.tables import fmt, num_text, ppl_cell, table
from ctxext.evaluation.sections.perplexity.schema import Perplexity
from ctxext.evaluation.sections.perplexity.settings import PPL_PROTOCOL

Named = list[tuple[str, Perplexity]]  # (model label, its perplexity part)


def named(models: list[dict[str, Any]]) -> Named:
    """The typed ``perplexity`` parts of the model entries that have one, with their labels."""
    return [(m["name"], Perplexity.model_validate(m["perplexity"])) for m in models if m.get("perplexity")]


def length_table(have: Named, lengths: list[int] | None = None) -> list[str]:
    """Perplexity by evaluation length: a row per length, a column per model.

    Args:
        have: the models' perplexity parts.
        lengths: the lengths to show (default: every length any model has).

    Returns:
        Markdown lines (none without a length).
    """
    if lengths is None:
        lengths = sorted({int(L) for _, p in have for L in p.by_length})
    if not have or not lengths:
        return []
    rows = [[str(L)] + [ppl_cell(p.by_length.get(str(L))) for _, p in have] for L in lengths]
    return table(["length"] + [name for name, _ in have], rows)


def bucket_table(have: Named) -> list[str]:
    """Perplexity by position of the predicted token: a row per bucket, a column per model."""
    buckets = [(name, p.by_bucket) for name, p in have if p.by_bucket]
    if not buckets:
        return []
    spans = sorted({(b.start, b.end) for _, found in buckets for b in found})
    rows = []
    for start, end in spans:
        cells = [ppl_cell(next((b for b in found if (b.start, b.end) == (start, end)), None)) for _, found in buckets]
        rows.append([f"{start}–{end}"] + cells)
    return table(["positions"] + [name for name, _ in buckets], rows)


def short_context_table(have: Named) -> list[str]:
    """Perplexity at each model's original context, and its change against the first such model."""
    short = [(name, p.short_context) for name, p in have if p.short_context]
    if not short:
        return []
    ref_name, ref = short[0]
    rows = []
    for name, s in short:
        if s is None or ref is None:
            continue
        delta = (s.ppl / ref.ppl - 1) * 100 if ref.ppl and s.ppl else None
        rows.append([name, str(s.length), ppl_cell(s), "–" if delta is None else f"{delta:+.2f} %"])
    return table(["model", "length", "ppl [95 % CI] (docs)", f"vs {ref_name}"], rows)


def perplexity_markdown(models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
    """The section's part of ``report.md``: by length, all documents, short context, by position, context use."""
    have = named(models)
    first = have[0][1]
    docs = first.documents
    source = (report.get("data", {}).get("perplexity") or {}).get("source") or "?"
    lines = ["## Perplexity", ""]
    lines += [f"Data: `{source}`. Protocol: {first.protocol or PPL_PROTOCOL}.", ""]
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
    lines += length_table(have)
    lines += all_documents_markdown(have)
    short = short_context_table(have)
    if short:
        lines += ["### Short-context regression (perplexity at the original context)", "", *short]
    buckets = bucket_table(have)
    if buckets:
        lines += [f"### By token position (documents reaching {first.bucket_length} tokens)", ""]
        lines += ["![perplexity by position](ppl_by_position.png)", ""]  # written whenever there are buckets
        lines += buckets
    cu_models = [m for m in models if (m.get("perplexity") or {}).get("context_use")]
    if cu_models:
        lines += _context_use_markdown(cu_models)
    return lines


def _context_use_markdown(cu_models: list[dict[str, Any]]) -> list[str]:
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
    lines += ["![context use](context_use.png)", ""]  # written whenever a model has the curve
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


def all_documents_markdown(have: Named) -> list[str]:
    """The secondary perplexity table: at each length, every document with at least that many tokens.

    Args:
        have: the models' perplexity parts.

    Returns:
        Markdown lines (none when no model has the view, or when it equals the main table).
    """
    have = [(name, p) for name, p in have if p.by_length_all]
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


# ---------------------------------------------------------------------------------------------
# The model card and the console
# ---------------------------------------------------------------------------------------------


def card_rows(models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
    """The card's perplexity part: the protocol, the data, the tables by length and by position."""
    have = named(models)
    lines: list[str] = []
    protocol = next((p.protocol for _, p in have if p.protocol), None)
    if protocol:
        lines += [f"Protocol: {protocol}", ""]
    source = (report.get("data", {}).get("perplexity") or {}).get("source")
    if source:
        lines += [f"Data: `{source}`", ""]
    by_length = length_table(have)
    if by_length:
        lines += [
            "Perplexity by evaluation length (lower is better): ppl [95 % CI] (documents); † beyond that "
            "model's configured context.",
            "",
            *by_length,
        ]
    buckets = bucket_table(have)
    if buckets:
        lines += ["Perplexity by position of the predicted token:", "", *buckets]
    return lines


def card_results(entry: dict[str, Any], report: dict[str, Any]) -> list[dict[str, Any]]:
    """The extended model's perplexity at every length, for the card's ``model-index``."""
    from ctxext.models.refs import is_hub_id

    source = (report.get("data", {}).get("perplexity") or {}).get("source")
    if isinstance(source, str) and source:
        dataset = (source, source) if is_hub_id(source) else ("text", Path(source).name or source)
    else:
        dataset = ("text", "held-out long documents")
    by_length = Perplexity.model_validate(entry["perplexity"]).by_length
    task = {"task": "Long-context language modeling", "dataset_type": dataset[0], "dataset_name": dataset[1]}
    return [
        {**task, "metric": "perplexity", "label": "Perplexity", "length": key, "value": round(e.ppl, 4)}
        for key, e in sorted(by_length.items(), key=lambda kv: int(kv[0]))
        if e.ppl is not None
    ]


def card_cost(extended: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """Perplexity at the original context (or the lengths within it), the base model against the extended one."""
    pair = named([base, extended])
    if len(pair) < 2:
        return []
    (_, b), (_, e) = pair
    if e.short_context is not None and b.short_context is not None and e.short_context.length == b.short_context.length:
        return [
            f"Perplexity at the original context ({e.short_context.length} tokens), base model vs this model:",
            "",
            *short_context_table(pair),
        ]
    original = int(base["rope"]["original_length"])
    short = sorted(int(L) for L in set(e.by_length) & set(b.by_length) if int(L) <= original)
    if not short:
        return []
    return [
        f"Perplexity within the original context ({original} tokens), base model vs this model:",
        "",
        *length_table(pair, short),
    ]


def summary(entry: dict[str, Any]) -> list[str]:
    """Console lines: the perplexity at each length, and at the original context."""
    p = entry["perplexity"]
    lines = []
    for L, e in p["by_length"].items():
        if e.get("ppl") is not None:
            mark = " †" if e.get("beyond_context") else ""
            lines.append(
                f"{L} tokens{mark}: {fmt(e['ppl'], 4)} [{fmt(e.get('ci_low'), 4)}, {fmt(e.get('ci_high'), 4)}] over "
                f"{e.get('documents')} documents ({p.get('mode')})"
            )
    s = p.get("short_context") or {}
    if s.get("ppl") is not None:
        lines.append(
            f"{s['length']} tokens (original context): {fmt(s['ppl'], 4)} [{fmt(s.get('ci_low'), 4)}, "
            f"{fmt(s.get('ci_high'), 4)}] over {s.get('documents')} documents"
        )
    return lines
