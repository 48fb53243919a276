"""The retrieval-grid suite sections, ``passkey:`` and ``needle:``: accuracy over lengths × depths.

Their folder: the settings (:mod:`.settings`, the flags of ``ctxext eval passkey`` / ``needle``), the engine
(:mod:`.engine`, which also serves the ``ruler`` section and the search), the results' schema (:mod:`.schema`),
``report.md`` / card / console (:mod:`.report`) and the paired trials (:mod:`.paired`: exact McNemar on the
same seeded trials, in the report's ``comparisons.grids``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from ctxext.evaluation.lengths import work_estimate
from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section
from ctxext.evaluation.sections.grids.paired import PAIRED_KEY
from ctxext.evaluation.sections.grids.schema import Grid
from ctxext.evaluation.sections.grids.settings import NeedleSettings, PasskeySettings


class GridSection(SuiteSection):
    """A retrieval grid: accuracy per (length, depth) cell, with Wilson intervals and per-trial outcomes."""

    schema = Grid
    paired_key = PAIRED_KEY
    card_title: ClassVar[str] = ""
    _chat: Any = None  # the run's chat-template decision (SuiteRun.chat), from begin()

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Keep the run's ``chat_template: auto`` decision: every model's prompts are formatted alike."""
        self._chat = run.chat

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """The grid of one model (:mod:`.engine`)."""
        from ctxext.evaluation.sections.grids.engine import GridSettings

        grid = GridSettings.from_settings(settings, lengths, beyond_context_ok, self._chat)
        return self.evaluate(loaded, grid, settings, show)

    def evaluate(self, loaded: Any, grid: Any, settings: Any, show: bool) -> dict[str, Any]:
        """Score the grid (the task's own engine)."""
        raise NotImplementedError

    def work_note(self, settings: Any) -> str | None:
        """How many tokens the lengths given in tokens score (depths × trials sequences at each)."""
        tokens = [n for n in settings.lengths if isinstance(n, int)]
        per_length = len(settings.depths) * settings.trials
        return work_estimate(self.name, tokens, per_length) if tokens else None

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """How the trials were scored, then accuracy by depth × length per model."""
        from ctxext.evaluation.sections.grids.report import grid_markdown

        return grid_markdown(models, self.name, self.title)

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """``<name>_heatmap.png``: accuracy by depth × length, a panel per model."""
        from ctxext.evaluation.sections.grids.report import grid_heatmap

        return {f"{self.name}_heatmap": grid_heatmap(plt, models, self.name, self.title, folder)}

    def paired(
        self, model: dict[str, Any], reference: dict[str, Any], resamples: int, seed: int, notes: list[str]
    ) -> list[dict[str, Any]]:
        """The exact McNemar test on the same trials, per length and over all lengths."""
        from ctxext.evaluation.sections.grids.paired import mcnemar_rows

        return mcnemar_rows(model["name"], self.name, model[self.name], reference[self.name], notes)

    def paired_markdown(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """One table of every retrieval comparison of the report."""
        from ctxext.evaluation.sections.grids.paired import mcnemar_markdown

        return mcnemar_markdown(rows, reference)

    def paired_summary(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """A line per comparison: correct trials of both, McNemar p."""
        from ctxext.evaluation.sections.grids.paired import mcnemar_summary

        return mcnemar_summary(rows, reference)

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """Each model's grid table."""
        from ctxext.evaluation.sections.grids.report import card_rows

        return card_rows(models, self.name, self.card_title)

    def summary(self, entry: dict[str, Any]) -> str | list[str] | None:
        """Overall accuracy [95 % CI] over the trials (and the generated score, when scored both ways)."""
        from ctxext.evaluation.sections.grids.report import summary

        return summary(entry, self.name)


@register_section
class PasskeySection(GridSection):
    """Passkey retrieval (Landmark Attention prompt) over lengths × depths, k seeded keys per cell, teacher-forced.

    A suite holding only a passkey: section (ctxext eval run), its keys as flags with the same defaults.
    """

    name = "passkey"
    title = "Passkey retrieval"
    card_title = "Passkey accuracy"
    settings = PasskeySettings
    data_keys = ("chat_template",)
    order = 10

    def evaluate(self, loaded: Any, grid: Any, settings: Any, show: bool) -> dict[str, Any]:
        """Passkey trials (:func:`.engine.evaluate_passkey`)."""
        from ctxext.evaluation.sections.grids.engine import evaluate_passkey

        return evaluate_passkey(loaded, grid, show)

    def card_results(self, entry: dict[str, Any], report: dict[str, Any]) -> list[dict[str, Any]]:
        """Passkey accuracy at every length."""
        from ctxext.evaluation.sections.grids.report import card_results

        names = ("Passkey retrieval", "Passkey retrieval (synthetic, landmark-attention prompt)", "Passkey accuracy")
        return card_results(entry, self.name, names)


@register_section
class NeedleSection(GridSection):
    """Needle in a haystack over lengths × depths with a configurable haystack, needle, question and answer.

    A suite holding only a needle: section (ctxext eval run), its keys as flags with the same defaults.
    """

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
        """Needle trials (:func:`.engine.evaluate_needle`)."""
        from ctxext.evaluation.sections.grids.engine import NeedleTask, evaluate_needle

        return evaluate_needle(loaded, grid, NeedleTask.from_settings(settings), show)
