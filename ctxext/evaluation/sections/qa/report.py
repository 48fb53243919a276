"""The ``qa`` section's part of ``report.md`` and of the model card (one table), its plot and its console line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.artifacts.tables import table
from ctxext.evaluation.sections.qa.schema import QA, QAScores


def qa_cell(s: QAScores | None) -> str:
    """``EM x / F1 y (examples)``."""
    if s is None or s.f1 is None or s.exact_match is None:
        return "–"
    return f"EM {s.exact_match:.1f} / F1 {s.f1:.1f} ({s.examples})"


def qa_table(models: list[dict[str, Any]]) -> list[str]:
    """Long-document QA: overall, truncation, by answer position and by context length; a column per model."""
    have = [(m["name"], QA.model_validate(m["qa"])) for m in models if m.get("qa")]
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


def qa_plot(plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
    """``qa_by_bucket.png``: F1 by answer position and by context length, a bar per model."""
    from ctxext.artifacts.figures import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "by_position", "answer position"), (axes[1], "by_length", "context length")):
        labels: list[str] = []
        for m in models:
            labels += [b for b in m["qa"][key] if b not in labels]
        width = 0.8 / len(models)
        for i, m in enumerate(models):
            vals = [(m["qa"][key].get(b) or {}).get("f1") or 0.0 for b in labels]
            ax.bar([j + i * width for j in range(len(labels))], vals, width=width, label=m["name"])
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(labels))], labels, rotation=30)
        ax.set_ylim(0, 100)
        ax.set_ylabel("F1 (%)")
        ax.set_title(f"QA F1 by {title}")
    axes[0].legend()
    return {"qa_by_bucket": save_figure(fig, folder, "qa_by_bucket.png")}


def summary(entry: dict[str, Any]) -> str:
    """EM and F1 overall."""
    from ctxext.evaluation.sections.grids.report import chat_summary

    q = entry["qa"]["overall"]
    return (
        f"EM {q['exact_match']:.1f}, F1 {q['f1']:.1f} over {q['examples']} examples "
        f"({entry['qa']['truncated']} truncated in the middle){chat_summary(entry['qa'])}"
    )
