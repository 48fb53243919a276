"""The retrieval grids' part of ``report.md`` and of the model card (``passkey``, ``needle``; ``ruler`` shares it).

Every table reads a typed grid (:class:`~ctxext.evaluation.sections.grids.schema.Grid`), so ``report.md`` and the
card show a grid's numbers alike; accuracies in percent.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ctxext.artifacts.tables import table
from ctxext.evaluation.sections.grids.schema import Generated, Grid


def grids_of(models: list[dict[str, Any]], task: str) -> list[tuple[str, Grid]]:
    """The typed grids of the model entries that have ``task``, with their labels."""
    return [(m["name"], Grid.model_validate(m[task])) for m in models if m.get(task)]


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


def chat_note(used: set[tuple[str | None, str | None]]) -> str:
    """One sentence naming the chat template prompts were wrapped in, and why (``(template, reason)`` pairs).

    Nothing for reports written before the setting.
    """
    named = sorted((u, why or "") for u, why in used if u)
    if not named:
        return ""

    def one(used: str, why: str) -> str:
        what = "none (plain prompts)" if used == "none" else f"`{used}`"
        return f"{what}, {why}" if why else what

    return " Chat template: " + "; ".join(one(u, why) for u, why in named) + "."


def chat_summary(result: dict[str, Any]) -> str:
    """The console's note of the chat template a section's prompts were in, and why (nothing for older reports)."""
    used, why = result.get("chat_template"), result.get("chat_template_reason")
    if not used:
        return ""
    return f"; chat template {used}" + (f" ({why})" if why else "")


def grid_markdown(models: list[dict[str, Any]], task: str, title: str) -> list[str]:
    """How the trials were scored, then accuracy by depth × length per model."""
    grids = grids_of(models, task)
    lines = [f"## {title}", ""]
    chats = {(g.chat_template, g.chat_template_reason) for _, g in grids}
    lines += [scoring_note({g.scoring for _, g in grids}) + chat_note(chats), ""]
    for name, g in grids:
        lines += grid_table(name, g)
    return lines


def card_rows(models: list[dict[str, Any]], task: str, card_title: str) -> list[str]:
    """Each model's grid table, under a line naming it."""
    lines: list[str] = []
    for name, g in grids_of(models, task):
        lines += [f"{card_title}, {name}:", "", *grid_table(name, g)]
    return lines


def card_results(entry: dict[str, Any], task: str, names: tuple[str, str, str]) -> list[dict[str, Any]]:
    """The extended model's accuracy (percent) at every length, for the card's ``model-index``.

    Args:
        entry: the model's entry.
        task: the section (``passkey``).
        names: ``(task name, dataset name, label)`` on the Hub.
    """
    grid = Grid.model_validate(entry[task])
    task_name, dataset, label = names
    rows = []
    for length in grid.lengths():
        acc = grid.accuracy_at(length)
        if acc is not None:
            rows.append(
                {"task": task_name, "dataset_type": task, "dataset_name": dataset, "metric": "accuracy",
                 "label": label, "length": str(length), "value": round(100.0 * acc, 2)}
            )  # fmt: skip
    return rows


def summary(entry: dict[str, Any], task: str) -> str:
    """Overall accuracy [95 % CI] over the trials (and the generated score, when scored both ways)."""
    result = entry[task]
    ov = result["overall"]
    line = (
        f"{_pct(ov['accuracy'])} % [{_pct(ov['ci_low'])}, {_pct(ov['ci_high'])}] over "
        f"{ov['trials']} trials ({result.get('scoring', 'generate')})"
    )
    generated = ov.get("generated")
    line += f"; generated {_pct(generated['score'])} (string match)" if generated else ""
    return line + chat_summary(result)


def grid_heatmap(plt: Any, models: list[dict[str, Any]], task: str, title: str, folder: Path) -> str:
    """Accuracy by depth × length, one panel per model; returns the file name (``<task>_heatmap.png``)."""
    import numpy as np

    from ctxext.artifacts.figures import save_figure

    fig, axes = plt.subplots(1, len(models), figsize=(4.5 * len(models) + 1, 4), squeeze=False, constrained_layout=True)
    image = None
    for ax, m in zip(axes[0], models, strict=True):
        cells = m[task]["cells"]
        lengths = sorted({c["length"] for c in cells})
        depths = sorted({c["depth"] for c in cells})
        grid = np.full((len(depths), len(lengths)), np.nan)
        for c in cells:
            grid[depths.index(c["depth"]), lengths.index(c["length"])] = (
                np.nan if c["accuracy"] is None else c["accuracy"]
            )
        image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(lengths)), [str(L) for L in lengths], rotation=45)
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("depth (%)")
        ax.set_title(m["name"])
    fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
    fig.suptitle(title)
    return save_figure(fig, folder, f"{task}_heatmap.png", tight=False)
