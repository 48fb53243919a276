"""The ``ruler:`` suite section: RULER-style synthetic tasks × lengths × depths, with effective length.

The tasks come from the task registry (:mod:`ctxext.tasks`); the engine is :mod:`ctxext.evaluation.ruler`.
Paired statistics need no hook: each task's grid (``cells`` with ``outcomes``) is compared trial by trial as
``ruler/<task>`` (:mod:`ctxext.evaluation.paired`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.evaluation.sections import SuiteSection, register_section
from ctxext.evaluation.settings import RulerSuiteSettings


@register_section
class RulerTasks(SuiteSection):
    """RULER-style synthetic tasks × lengths × depths on one haystack, with effective length per task."""

    name = "ruler"
    title = "RULER-style tasks"
    settings = RulerSuiteSettings
    data_keys = ("haystack", "chat_template")
    order = 45  # after qa: the suite definition's key order of report.json before sections were registered

    def check(self, settings: Any) -> None:
        """Unknown tasks, options or templates fail when the suite loads."""
        from ctxext.evaluation.ruler import RulerSettings

        RulerSettings.of_section(settings, [1], False).check()

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The haystack's source (nothing for noise)."""
        from ctxext.scoring.texts import describe_source

        if settings.haystack == "noise":
            return None
        return describe_source(settings.haystack, settings.text_field, settings.split)

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """Every task of one model (:func:`ctxext.evaluation.ruler.evaluate_ruler`)."""
        from ctxext.evaluation.ruler import RulerSettings, evaluate_ruler

        return evaluate_ruler(loaded, RulerSettings.of_section(settings, lengths, beyond_context_ok), show)

    def annotate(self, result: dict[str, Any], spec: Any) -> None:
        """Mark the tasks this model was fine-tuned on (from a run folder's recipe ``data.mixture``)."""
        from ctxext.evaluation.ruler import trained_tasks

        result["trained_tasks"] = trained_tasks(spec.adapter or spec.ref)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """Effective lengths side by side, then score by task × length per model."""
        return ruler_markdown(models)

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """None: per-task grids are too long for a card (the published report has them, and the heatmap)."""
        return []

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """``ruler_heatmap.png``: tasks × lengths per model, the effective length framed."""
        return {"ruler_heatmap": ruler_heatmap(plt, models, folder)}


def ruler_markdown(models: list[dict[str, Any]]) -> list[str]:
    """The RULER-style section: score by task × length per model, and effective lengths side by side."""
    first = models[0]["ruler"]
    st = first["settings"]
    ref = (
        f"{st['threshold'] * 100:g} % of the model's own score at its original length"
        if st["threshold_reference"] == "original"
        else f"an absolute {st['threshold'] * 100:g} %"
    )
    from ctxext.artifacts.tables import chat_note, scoring_note, table

    lines = ["## RULER-style tasks", ""]
    lines += [
        f"Haystack: `{first['haystack']}`; depths {', '.join(f'{d:g}' for d in st['depths'])} %; {st['trials']} trials "
        f"per cell; templates: {st['templates']}. {scoring_note({first.get('scoring')})}"
        f"{chat_note({m['ruler'].get('chat_template') for m in models})} Effective length: the longest "
        f"length up to which every evaluated length scores ≥ {ref} (the section's threshold setting; RULER's and "
        "NoLiMa's named definitions follow); n/a: the task scores below "
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
    lines += table(["task"] + names, rows)
    from ctxext.evaluation.ruler import named_effective_markdown

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
