"""The ``harness`` section's part of ``report.md`` and its console lines."""

from __future__ import annotations

from typing import Any


def harness_markdown(models: list[dict[str, Any]]) -> list[str]:
    """``report.md``'s lm-eval part: each task's metrics per model (± standard error, documents)."""
    names = sorted({t for m in models for t in m["harness"]["tasks"]})
    version = models[0]["harness"].get("version", "?")
    lines = [f"## lm-evaluation-harness {version}", ""]
    lines += [
        "The model object ctxext loaded and verified, passed to lm-eval (`HFLM(pretrained=<model>)`): no rebuild "
        "from a folder. Exact match after stripping for ctxext's exported tasks.",
        "",
        "| task | metric | " + " | ".join(m["name"] for m in models) + " |",
        "| --- | --- |" + " --- |" * len(models),
    ]
    for name in names:
        entries = [m["harness"]["tasks"].get(name) or {} for m in models]
        metrics = sorted({k for e in entries for k in e.get("metrics", {})})
        for metric in metrics:
            cells = []
            for e in entries:
                value = e.get("metrics", {}).get(metric)
                err = e.get("stderr", {}).get(metric)
                cell = "–" if value is None else f"{value:.4g}"
                cell += f" ± {err:.2g}" if isinstance(err, (int, float)) else ""
                cells.append(cell + (f" ({e['documents']})" if value is not None and e.get("documents") else ""))
            lines.append(f"| {name} | {metric} | " + " | ".join(cells) + " |")
    notes = sorted({n for m in models for n in m["harness"].get("notes", [])})
    lines += [""] + [f"Note: {n}." for n in notes] + ([""] if notes else [])
    return lines


def summary(entry: dict[str, Any]) -> list[str]:
    """Console lines: each task's metrics and documents."""
    lines = []
    for name, task in entry["harness"]["tasks"].items():
        shown = ", ".join(f"{k} {v:.4g}" for k, v in task["metrics"].items())
        lines.append(f"{name}: {shown} ({task['documents']} documents)")
    return lines
