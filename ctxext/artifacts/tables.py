"""The Markdown building blocks of an evaluation report: number formats, tables, the models table.

Each suite section draws its own tables (``ctxext/evaluation/sections/<name>/report.py``) with these, so every
part of ``report.md`` and of the model card formats numbers alike. Cells: ``ppl [95 % CI] (documents)``, † beyond
the model's configured context; accuracies in percent.
"""

from __future__ import annotations

import math

from ctxext.artifacts.report import ModelEntry, PplEntry


def fmt(x: float | None, digits: int = 3) -> str:
    """A number with ``digits`` significant digits; ``–`` for a missing or non-finite one."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:.{digits}g}" if abs(x) < 1e4 else f"{x:.3e}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table (and a blank line after it)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return lines + [""]


def p_text(p: float | None) -> str:
    """A p-value in a table: two significant digits, "<0.001" below, "–" when not computed."""
    if p is None or not math.isfinite(p):
        return "–"
    return f"{p:.2g}" if p >= 0.001 else "<0.001"


def num_text(x: float | None, spec: str, scale: float = 1.0) -> str:
    """A number of the report's JSON form in ``spec`` (times ``scale``); null or NaN (not measured) is "–"."""
    return "–" if x is None or not math.isfinite(x) else f"{x * scale:{spec}}"


def ppl_cell(e: PplEntry | None) -> str:
    """``ppl [ci_low, ci_high] (documents)``, † when beyond the model's context."""
    if e is None or e.ppl is None:
        return "–"
    mark = " †" if getattr(e, "beyond_context", False) else ""  # a length's entry says so
    return f"{fmt(e.ppl)} [{fmt(e.ci_low)}, {fmt(e.ci_high)}] ({e.documents}){mark}"


def models_table(models: list[ModelEntry]) -> list[str]:
    """How each model was loaded and its RoPE."""
    # The temperature column only where a model runs with one (a calibrated run).
    tempered = any((m.model.attention_temperature or 1.0) != 1.0 for m in models)
    rows = []
    for m in models:
        r, info = m.rope, m.model
        row = [
            m.name,
            f"`{info.base or info.ref}`",
            f"`{info.adapter}`" if info.adapter else "–",
            r.rope_type,
            fmt(r.factor),
            f"{r.rope_theta:g}",
            str(r.original_length),
            str(r.current_length),
            "✓" if info.rope_verified else "not checked",
        ]
        rows.append(row + ([f"{info.attention_temperature or 1.0:g}"] if tempered else []))
    head = ["model", "base", "adapter", "rope", "factor", "θ", "original ctx", "context", "RoPE check"]
    return table(head + (["attention temperature"] if tempered else []), rows)
