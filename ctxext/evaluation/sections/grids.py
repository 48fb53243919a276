"""The retrieval-grid suite sections, ``passkey:`` and ``needle:``: accuracy over lengths × depths.

Their settings are :class:`~ctxext.evaluation.settings.PasskeySettings` and
:class:`~ctxext.evaluation.settings.NeedleSettings` (the flags of ``ctxext eval passkey`` / ``needle``); the
engine is :mod:`ctxext.evaluation.grid`. Paired statistics need no hook: every section whose results hold
``cells`` with ``outcomes`` is compared trial by trial (exact McNemar, :mod:`ctxext.evaluation.paired`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ctxext.evaluation.sections import SuiteSection, register_section
from ctxext.evaluation.settings import NeedleSettings, PasskeySettings


class GridSection(SuiteSection):
    """A retrieval grid: accuracy per (length, depth) cell, with Wilson intervals and per-trial outcomes."""

    card_title: ClassVar[str] = ""

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """The grid of one model (:mod:`ctxext.evaluation.grid`)."""
        from ctxext.evaluation.grid import GridSettings

        return self.evaluate(loaded, GridSettings.from_settings(settings, lengths, beyond_context_ok), settings, show)

    def evaluate(self, loaded: Any, grid: Any, settings: Any, show: bool) -> dict[str, Any]:
        """Score the grid (the task's own engine)."""
        raise NotImplementedError

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """How the trials were scored, then accuracy by depth × length per model."""
        from ctxext.artifacts.tables import chat_note, grid_table, scoring_note

        grids = _grids(models, self.name)
        lines = [f"## {self.title}", ""]
        lines += [scoring_note({g.scoring for _, g in grids}) + chat_note({g.chat_template for _, g in grids}), ""]
        for name, g in grids:
            lines += grid_table(name, g)
        return lines

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """Each model's grid table."""
        from ctxext.artifacts.tables import grid_table

        lines: list[str] = []
        for name, g in _grids(models, self.name):
            lines += [f"{self.card_title}, {name}:", "", *grid_table(name, g)]
        return lines

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """``<name>_heatmap.png``: accuracy by depth × length, a panel per model."""
        return {f"{self.name}_heatmap": grid_heatmap(plt, models, self.name, self.title, folder)}

    def summary(self, entry: dict[str, Any]) -> str | None:
        """Overall accuracy [95 % CI] over the trials (and the generated score, when scored both ways)."""
        result = entry[self.name]
        ov = result["overall"]
        line = (
            f"{ov['accuracy'] * 100:.1f} % [{ov['ci_low'] * 100:.1f}, {ov['ci_high'] * 100:.1f}] over "
            f"{ov['trials']} trials ({result.get('scoring', 'generate')})"
        )
        generated = ov.get("generated")
        return line + (f"; generated {generated['score'] * 100:.1f} (string match)" if generated else "")


@register_section
class PasskeySection(GridSection):
    """Passkey retrieval (Landmark Attention prompt) over lengths × depths, k seeded keys per cell, teacher-forced."""

    name = "passkey"
    title = "Passkey retrieval"
    card_title = "Passkey accuracy"
    settings = PasskeySettings
    data_keys = ("chat_template",)
    order = 10

    def evaluate(self, loaded: Any, grid: Any, settings: Any, show: bool) -> dict[str, Any]:
        """Passkey trials (:func:`ctxext.evaluation.grid.evaluate_passkey`)."""
        from ctxext.evaluation.grid import evaluate_passkey

        return evaluate_passkey(loaded, grid, show)


@register_section
class NeedleSection(GridSection):
    """Needle in a haystack over lengths × depths with a configurable haystack, needle, question and answer."""

    name = "needle"
    title = "Needle in a haystack"
    card_title = "Needle-in-a-haystack accuracy"
    settings = NeedleSettings
    data_keys = ("haystack", "chat_template")
    order = 20

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The haystack's source."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.haystack, settings.text_field, settings.split)

    def evaluate(self, loaded: Any, grid: Any, settings: Any, show: bool) -> dict[str, Any]:
        """Needle trials (:func:`ctxext.evaluation.grid.evaluate_needle`)."""
        from ctxext.evaluation.grid import NeedleTask, evaluate_needle

        return evaluate_needle(loaded, grid, NeedleTask.from_settings(settings), show)


def _grids(models: list[dict[str, Any]], task: str) -> list[tuple[str, Any]]:
    # The typed grids (ctxext.artifacts.report.Grid) the shared tables read.
    from ctxext.artifacts.report import Grid

    return [(m["name"], Grid.model_validate(m[task])) for m in models]


def grid_heatmap(plt: Any, models: list[dict[str, Any]], task: str, title: str, folder: Path) -> str:
    """Accuracy by depth × length, one panel per model; returns the file name."""
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
