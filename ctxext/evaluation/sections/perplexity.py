"""The ``perplexity:`` suite section: perplexity by length, by token position and by context limit.

Its settings are :class:`~ctxext.evaluation.settings.PerplexitySettings` (the flags of ``ctxext eval ppl``);
the engine is :mod:`ctxext.evaluation.perplexity`. Context limits (``2x``, ``target``…) resolve against the
reference model like the lengths, so the section keeps the run's contexts from :meth:`begin`. Paired ratios
(same documents) are computed from the results' ``per_document`` part by :mod:`ctxext.evaluation.paired`; the
model card's perplexity tables, metadata and short-context section are the card's own.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.artifacts.report import EvalReport, ModelEntry
from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section
from ctxext.evaluation.settings import PPL_PROTOCOL, PerplexitySettings, auto_bucket, resolve_length


@register_section
class PerplexitySection(SuiteSection):
    """Perplexity by evaluation length and token-position bucket (truncated documents), with 95% CIs."""

    name = "perplexity"
    title = "Perplexity"
    settings = PerplexitySettings
    data_keys = ("data",)
    order = 0
    command = "ppl"

    def __init__(self) -> None:
        self._contexts: tuple[int, int] | None = None

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Keep the reference model's contexts: the context limits resolve against them."""
        self._contexts = (run.original, run.context)

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The documents' source."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.data, settings.text_field, settings.split)

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """One model's perplexities, the section's settings with its lengths, limits and bucket resolved."""
        from ctxext.evaluation.perplexity import evaluate_perplexity

        original, context = self._contexts or (loaded.original_length, loaded.context_length)
        limits = [resolve_length(k, original, context) for k in settings.context_limits]
        resolved = {
            "lengths": lengths,
            "context_limits": [k for k in limits if k < lengths[-1]],
            "bucket_size": auto_bucket(lengths[-1]) if settings.bucket_size == "auto" else settings.bucket_size,
            "allow_beyond_context": beyond_context_ok or settings.allow_beyond_context,
        }
        return evaluate_perplexity(loaded, None, settings.model_copy(update=resolved), show)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """By length (and all documents), short-context regression, by position, context use."""
        return ppl_markdown(EvalReport.model_validate(report), report)

    def paired_markdown(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """The ratios ppl(model) / ppl(reference) by length, then by token position."""
        from ctxext.artifacts.tables import p_text, table

        lines: list[str] = []
        by_len = [r for r in rows if r["view"] == "length"]
        if by_len:
            lines += [
                "### Perplexity ratio by length",
                "",
                f"ppl(model) / ppl({reference}) on the same tokens of the same documents, with a 95 % paired bootstrap "
                "interval (documents resampled jointly); ** the interval excludes 1.",
                "",
            ]
            cells = [
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
            lines += table(["model", "length", "ratio [95 % CI]", "docs", "p", "p Holm"], cells)
        by_bucket = [r for r in rows if r["view"] == "bucket"]
        if by_bucket:
            models = list(dict.fromkeys(r["model"] for r in by_bucket))
            edges = list(dict.fromkeys((r["start"], r["end"]) for r in by_bucket))
            lines += [
                "### Perplexity ratio by token position",
                "",
                f"ppl(model) / ppl({reference}) per position bucket.",
                "",
            ]
            grid: list[list[str]] = []
            for start, end in edges:
                row = [f"{start}–{end}"]
                for name in models:
                    r = next((x for x in by_bucket if x["model"] == name and x["start"] == start), None)
                    row.append("–" if r is None else _ratio_cell(r))
                grid.append(row)
            lines += table(["positions"] + models, grid)
        return lines

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """None here: the card writes its perplexity tables, metadata and short-context part itself."""
        return []

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """Perplexity by position, by length, and the context-use curve (each when the results have it)."""
        from ctxext.artifacts.figures import save_figure

        written: dict[str, str] = {}
        ppl = [m for m in models if m.get("perplexity", {}).get("by_bucket")]
        if ppl:
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for m in ppl:
                bb = m["perplexity"]["by_bucket"]
                _ppl_with_ci(ax, [(b["start"] + b["end"]) / 2 for b in bb], bb, m["name"])
            for m in ppl:
                ax.axvline(m["rope"]["original_length"], color="grey", linestyle=":", linewidth=1)
            ax.set_xlabel("token position (bucket centre)")
            ax.set_ylabel("perplexity")
            ax.set_yscale("log")
            ax.set_title("Perplexity by position (95 % CI; dotted: original context)")
            ax.legend()
            written["perplexity_by_position"] = save_figure(fig, folder, "ppl_by_position.png")

        by_len = [m for m in models if m.get("perplexity", {}).get("by_length")]
        if by_len:
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for m in by_len:
                items = sorted(
                    ((int(L), e) for L, e in m["perplexity"]["by_length"].items() if e.get("ppl")), key=lambda t: t[0]
                )
                _ppl_with_ci(ax, [L for L, _ in items], [e for _, e in items], m["name"])
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("evaluation length (tokens)")
            ax.set_ylabel("perplexity")
            ax.set_title("Perplexity by evaluation length (95 % CI)")
            ax.legend()
            written["perplexity_by_length"] = save_figure(fig, folder, "ppl_by_length.png")

        cu = [m for m in models if m.get("perplexity", {}).get("context_use")]
        if cu:
            fig, ax = plt.subplots(figsize=(7, 4.2))
            for m in cu:
                c = m["perplexity"]["context_use"]
                lim = c["limits"]
                (line,) = ax.plot([e["context"] for e in lim], [_f(e["ppl"]) for e in lim], marker="o", label=m["name"])
                ax.axhline(_f(c["full"]["ppl"]), color=line.get_color(), linestyle="--", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context limit k (tokens)")
            ax.set_ylabel("perplexity of the same target tokens")
            ax.set_title("Context use (dashed: full context)")
            ax.legend()
            written["perplexity_context_use"] = save_figure(fig, folder, "context_use.png")
        return written


def _f(x: float | None) -> float:
    # The JSON form writes an unmeasured value as null; matplotlib wants NaN (a gap).
    import math

    return math.nan if x is None else x


def _ppl_with_ci(ax: Any, x: list[float], entries: list[dict[str, Any]], label: str) -> None:
    # One model's perplexity curve (entries with ppl / ci_low / ci_high) and its 95 % band.
    ax.plot(x, [_f(e["ppl"]) for e in entries], marker="o", label=label)
    ax.fill_between(x, [_f(e["ci_low"]) for e in entries], [_f(e["ci_high"]) for e in entries], alpha=0.2)


def ppl_markdown(report: EvalReport, raw: dict[str, Any]) -> list[str]:
    """The section's part of ``report.md``: by length, all documents, short context, by position, context use."""
    from ctxext.artifacts.tables import bucket_table, ppl_length_table, short_context_table

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
        lines += ["![perplexity by position](ppl_by_position.png)", ""]  # written whenever there are buckets
        lines += buckets
    cu_models = [m for m in raw["models"] if (m.get("perplexity") or {}).get("context_use")]
    if cu_models:
        lines += _context_use_markdown(cu_models)
    return lines


def _context_use_markdown(cu_models: list[dict[str, Any]]) -> list[str]:
    from ctxext.artifacts.tables import table

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
    from ctxext.artifacts.tables import fmt

    if not e or e.get("ppl") is None:
        return "–"
    return f"{fmt(e['ppl'])} [{fmt(e.get('ci_low'))}, {fmt(e.get('ci_high'))}] ({e.get('documents')})"


def _gain_cell(e: dict[str, Any]) -> str:
    from ctxext.artifacts.tables import fmt, num_text

    low, high = num_text(e["gain_nll_ci_low"], "+.4f"), num_text(e["gain_nll_ci_high"], "+.4f")
    gain = f"{num_text(e['gain_nll'], '+.4f')} [{low}, {high}]"
    return f"{fmt(e['ppl'])}; gain {gain}"


def ppl_all_documents_markdown(models: list[ModelEntry]) -> list[str]:
    """The secondary perplexity table: at each length, every document with at least that many tokens.

    Args:
        models: model entries with a ``perplexity`` section.

    Returns:
        Markdown lines (none when no model has the view, or when it equals the main table).
    """
    from ctxext.artifacts.tables import ppl_cell, table

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


def _ratio_cell(r: dict[str, Any]) -> str:
    import math

    from ctxext.artifacts.tables import num_text

    low, high = r.get("ci_low"), r.get("ci_high")
    if low is None or high is None or not math.isfinite(low):
        return f"{num_text(r['ratio'], '.3f')}× [–]"
    mark = "" if low <= 1 <= high else " **"
    return f"{num_text(r['ratio'], '.3f')}× [{low:.3f}, {high:.3f}]{mark}"
