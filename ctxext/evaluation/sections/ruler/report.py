"""The ``ruler`` section's part of ``report.md``, its heatmap and its console lines.

Every function reads the report's JSON form (model entries holding a ``ruler`` part, its schema
:class:`~ctxext.evaluation.sections.ruler.schema.Ruler`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def ruler_markdown(models: list[dict[str, Any]]) -> list[str]:
    """The RULER-style section: score by task × length per model, and effective lengths side by side."""
    first = models[0]["ruler"]
    st = first["settings"]
    ref = (
        f"{st['threshold'] * 100:g} % of the model's own score at its original length"
        if st["threshold_reference"] == "original"
        else f"an absolute {st['threshold'] * 100:g} %"
    )
    na = (
        f"; n/a: the task scores below {st.get('min_reference', 0) * 100:g} % at the original length, so it has "
        "no relative threshold"
        if st["threshold_reference"] == "original"
        else ""
    )
    from ctxext.artifacts.tables import table
    from ctxext.evaluation.sections.grids.report import chat_note, scoring_note

    lines = ["## RULER-style tasks", ""]
    chats = {(m["ruler"].get("chat_template"), m["ruler"].get("chat_template_reason")) for m in models}
    lines += [
        f"Haystack: `{first['haystack']}`; depths {', '.join(f'{d:g}' for d in st['depths'])} %; {st['trials']} trials "
        f"per cell; templates: {st['templates']}. {scoring_note({first.get('scoring')})}"
        f"{chat_note(chats)} Effective length: the longest "
        f"length up to which every evaluated length scores ≥ {ref} (the section's threshold setting; RULER's and "
        f"NoLiMa's named definitions follow){na}. Cells: "
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
        [
            "**overall** (mean over the tasks"
            + (" with a reference)" if st["threshold_reference"] == "original" else ")")
        ]
        + [_eff(m["ruler"]["effective_length"]) for m in models]
    )
    lines += ["### Effective length", ""]
    lines += table(["task"] + names, rows)

    lines += named_effective_markdown(models)
    from ctxext.evaluation.control import control_markdown

    lines += control_markdown(models)
    for m in models:
        r = m["ruler"]
        lengths = [str(L) for L in r["settings"]["lengths"]]
        both = r.get("scoring") == "both"
        lines += [f"### {m['name']}", ""]
        lines += ["Cells: teacher-forced accuracy / generated string-match score (trials).", ""] if both else []
        body = []
        for t, res in r["tasks"].items():
            row = [t + (" ✱" if res.get("registry_task") in (r.get("trained_tasks") or []) else "")]
            for L in lengths:
                bl = res["by_length"].get(L)
                cell: dict[str, Any] = next((c for c in res["cells"] if str(c["length"]) == L), {})
                gen = f" / {bl['generated']['score'] * 100:.0f}" if bl and both and bl.get("generated") else ""
                row.append(
                    "–"
                    if bl is None
                    else f"{bl['accuracy'] * 100:.0f}{gen} ({bl['trials']}){' †' if cell.get('beyond_context') else ''}"
                )
            body.append(row)
        counted = ", ".join(r["effective_length"].get("tasks") or []) or "none"
        body.append([f"**mean** ({counted})"] + [f"{r['mean_by_length'][L] * 100:.0f}" for L in lengths])
        header = [f"{L}{' (orig.)' if int(L) == r['original_length'] else ''}" for L in lengths]
        lines += table(["task \\ length", *header], body)
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
    return f"{e['length']}" + (f" (≥ {bar * 100:.0f} %)" if bar is not None else "")


def ruler_heatmap(plt: Any, models: list[dict[str, Any]], folder: Path) -> str:
    """Tasks × lengths accuracy per model, the effective length of each task marked by a black frame."""
    import numpy as np
    from matplotlib.patches import Rectangle

    from ctxext.artifacts.figures import save_figure

    fig, axes = plt.subplots(
        1,
        len(models),
        figsize=(3.2 * len(models) + 2, 0.45 * len(models[0]["ruler"]["tasks"]) + 2.2),
        squeeze=False,
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
    return save_figure(fig, folder, "ruler_heatmap.png", tight=False)


SCORING_LABELS = {"teacher_forced": "teacher-forced accuracy", "generated": "generated, RULER string match"}


def named_effective_markdown(models: list[dict[str, Any]]) -> list[str]:
    """``report.md`` lines: effective lengths by RULER's and NoLiMa's definitions, per scoring, side by side.

    Args:
        models: report model entries (JSON form) with a ``ruler`` section.

    Returns:
        Markdown lines (none for reports written before the named definitions).
    """
    from ctxext.artifacts.tables import table
    from ctxext.evaluation.sections.ruler.engine import NAMED_THRESHOLDS

    scorings = [k for k in SCORING_LABELS if any(k in (m["ruler"].get("effective_lengths") or {}) for m in models)]
    if not scorings:
        return []
    lines = ["### Effective length: RULER and NoLiMa", ""]
    for scoring in scorings:
        header = ["task"]
        for m in models:
            header += [f"{m['name']}: {label}" for label, _, _ in NAMED_THRESHOLDS.values()]
        rows = []
        for t in models[0]["ruler"]["tasks"]:
            row = [t]
            for m in models:
                named = m["ruler"]["tasks"].get(t, {}).get("effective_lengths", {}).get(scoring, {})
                row += [_named_cell(named.get(k)) for k in NAMED_THRESHOLDS]
            rows.append(row)
        overall = ["**overall** (mean over tasks)"]
        for m in models:
            named = (m["ruler"].get("effective_lengths") or {}).get(scoring, {})
            overall += [_named_cell(named.get(k)) for k in NAMED_THRESHOLDS]
        lines += [f"Scoring: {SCORING_LABELS[scoring]}.", "", *table(header, rows + [overall])]
    return lines


def _named_cell(e: dict[str, Any] | None) -> str:
    if not e:
        return "–"
    if e.get("length") is not None:
        return str(e["length"])
    if e.get("threshold") is None:
        return "n/a (no reference)"
    return f"< shortest (≥ {e['threshold'] * 100:.1f} %)"


def summary(entry: dict[str, Any]) -> list[str]:
    """Console lines: the effective length (the section's definition, per task), then RULER's and NoLiMa's."""
    r = entry["ruler"]
    per_task = ", ".join(f"{t} {e['effective_length']['length'] or 'n/a'}" for t, e in r["tasks"].items())
    from ctxext.evaluation.sections.grids.report import chat_summary

    lines = [f"effective length {r['effective_length']['length'] or 'n/a'} ({per_task}){chat_summary(r)}"]
    for scoring, named in (r.get("effective_lengths") or {}).items():
        both = "; ".join(f"{e['name']} {e['length'] or 'n/a'}" for e in named.values())
        lines.append(f"{scoring.replace('_', '-')}: {both}")
    return lines
