"""The Markdown tables of an evaluation report, shared by ``report.md`` and the model card.

Each function takes typed report entries (:mod:`ctxext.artifacts.report`) and returns Markdown lines, so the
card shows a report's numbers exactly as ``report.md`` does. Cells: ``ppl [95 % CI] (documents)``, † beyond the
model's configured context; accuracies in percent.
"""

from __future__ import annotations

import math

from ctxext.artifacts.report import Generated, Grid, ModelEntry, PplEntry, PplLength, QAScores


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
    mark = " †" if isinstance(e, PplLength) and e.beyond_context else ""
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


def ppl_length_table(models: list[ModelEntry], lengths: list[int] | None = None) -> list[str]:
    """Perplexity by evaluation length: a row per length, a column per model.

    Args:
        models: entries with a ``perplexity`` section.
        lengths: the lengths to show (default: every length any model has).

    Returns:
        Markdown lines (none without a length).
    """
    have = [(m.name, m.perplexity) for m in models if m.perplexity]
    if lengths is None:
        lengths = sorted({int(L) for _, p in have for L in p.by_length})
    if not have or not lengths:
        return []
    rows = [[str(L)] + [ppl_cell(p.by_length.get(str(L))) for _, p in have] for L in lengths]
    return table(["length"] + [name for name, _ in have], rows)


def bucket_table(models: list[ModelEntry]) -> list[str]:
    """Perplexity by position of the predicted token: a row per bucket, a column per model."""
    have = [(m.name, m.perplexity.by_bucket) for m in models if m.perplexity and m.perplexity.by_bucket]
    if not have:
        return []
    spans = sorted({(b.start, b.end) for _, buckets in have for b in buckets})
    rows = []
    for start, end in spans:
        cells = [ppl_cell(next((b for b in buckets if (b.start, b.end) == (start, end)), None)) for _, buckets in have]
        rows.append([f"{start}–{end}"] + cells)
    return table(["positions"] + [name for name, _ in have], rows)


def short_context_table(models: list[ModelEntry]) -> list[str]:
    """Perplexity at each model's original context, and its change against the first such model."""
    short = [(m.name, m.perplexity.short_context) for m in models if m.perplexity and m.perplexity.short_context]
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


def grid_table(name: str, grid: Grid) -> list[str]:
    """A retrieval grid of one model: its overall accuracy, then accuracy by length × depth.

    Args:
        name: the model's label.
        grid: its ``passkey`` / ``needle`` section (or a RULER-style task).

    Returns:
        Markdown lines.
    """
    lines = []
    ov = grid.overall
    both = _both_scorings(grid)
    if ov is not None and ov.accuracy is not None:
        gen = "" if ov.generated is None else f"; generated {_generated_text(ov.generated)}"
        lines += [
            f"**{name}**: overall {ov.accuracy * 100:.1f} % [{_pct(ov.ci_low)}, {_pct(ov.ci_high)}] "
            f"({ov.trials} trials){gen}. Cells: {'teacher-forced / generated' if both else 'accuracy'} % (trials).",
            "",
        ]
    else:
        lines += [f"**{name}**. Cells: accuracy % (trials).", ""]
    depths = grid.depths()
    rows = []
    for L in grid.lengths():
        row = [str(L)]
        for d in depths:
            c = next((c for c in grid.cells if c.length == L and c.depth == d), None)
            if c is None:
                row.append("–")
                continue
            gen = f" / {_pct(c.generated.score, 0)}" if both and c.generated is not None else ""
            row.append(f"{_pct(c.accuracy, 0)}{gen} ({c.trials}){' †' if c.beyond_context else ''}")
        agg = grid.by_length.get(str(L))
        if agg is not None and agg.ci_low is not None:
            row.append(f"{_pct(agg.accuracy, 0)} [{_pct(agg.ci_low, 0)}, {_pct(agg.ci_high, 0)}]")
        else:
            row.append(_pct(grid.accuracy_at(L), 0))
        rows.append(row)
    return lines + table(["length \\ depth %"] + [f"{d:g}" for d in depths] + ["all [95 % CI]"], rows)


def _both_scorings(grid: Grid) -> bool:
    return bool(grid.cells) and grid.cells[0].teacher_forced is not None and grid.cells[0].generated is not None


def _generated_text(g: Generated) -> str:
    return f"{_pct(g.score)} ({g.metric})"


def _pct(x: float | None, digits: int = 1) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x * 100:.{digits}f}"


def qa_cell(s: QAScores | None) -> str:
    """``EM x / F1 y (examples)``."""
    if s is None or s.f1 is None or s.exact_match is None:
        return "–"
    return f"EM {s.exact_match:.1f} / F1 {s.f1:.1f} ({s.examples})"


def qa_table(models: list[ModelEntry]) -> list[str]:
    """Long-document QA: overall, truncation, by answer position and by context length; a column per model."""
    have = [(m.name, m.qa) for m in models if m.qa]
    if not have:
        return []
    rows = [["overall"] + [qa_cell(qa.overall) for _, qa in have]]
    rows.append(["truncated (middle)"] + [f"{qa.truncated} of {qa.examples}" for _, qa in have])
    for key, label in (("by_position", "answer at"), ("by_length", "context tokens")):
        buckets: list[str] = []
        for _, qa in have:
            buckets += [b for b in getattr(qa, key) if b not in buckets]
        for b in buckets:
            # "answer truncated away" (cut out by the middle truncation) reads on its own.
            name = b if b.startswith("answer") else f"{label} {b}"
            rows.append([name] + [qa_cell(getattr(qa, key).get(b)) for _, qa in have])
    return table(["bucket"] + [name for name, _ in have], rows)


SCORING_NOTES = {
    "teacher-forced": "teacher-forced (one forward pass over prompt + answer; correct iff every answer token is the "
    "argmax — exact for greedy decoding; no KV cache, no generation config)",
    "generate": "generation (explicit greedy config; KV cache off for dynamic / longrope; correct iff the generated "
    "tokens start with the answer's; RULER's string-match score beside it)",
    "both": "teacher-forced and generated on the same trials (accuracy: teacher-forced; generated: RULER's "
    "string-match score of greedy generations)",
}


def scoring_note(kinds: set[str | None]) -> str:
    """One line naming how a retrieval section was scored (reports before scoring modes: generation)."""
    names = sorted(k or "generate (legacy: first number / word recall)" for k in kinds)
    return "Scoring: " + "; ".join(SCORING_NOTES.get(k, k) for k in names) + ". Prompt + answer fit the length."


def chat_note(used: set[str | None]) -> str:
    """One sentence naming the chat template prompts were wrapped in (nothing for reports before the setting)."""
    named = sorted(u for u in used if u)
    if not named:
        return ""
    return " Chat template: " + ", ".join("none (plain prompts)" if u == "none" else f"`{u}`" for u in named) + "."
