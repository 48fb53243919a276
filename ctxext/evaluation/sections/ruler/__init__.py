"""The ``ruler:`` suite section: RULER-style synthetic tasks × lengths × depths, with effective length.

The tasks come from the task registry (:mod:`ctxext.tasks`). Its folder: the settings (:mod:`.settings`), the
engine (:mod:`.engine`, on the retrieval grids' engine), the results' schema (:mod:`.schema`) and ``report.md`` /
console (:mod:`.report`). Each task's grid is paired trial by trial like the retrieval grids' (exact McNemar,
rows labelled ``ruler/<task>`` in the report's ``comparisons.grids``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section
from ctxext.evaluation.sections.grids.paired import PAIRED_KEY
from ctxext.evaluation.sections.ruler.schema import Ruler
from ctxext.evaluation.sections.ruler.settings import RulerSuiteSettings


@register_section
class RulerTasks(SuiteSection):
    """RULER-style synthetic tasks × lengths × depths on one haystack, with effective length per task."""

    name = "ruler"
    title = "RULER-style tasks"
    settings = RulerSuiteSettings
    schema = Ruler
    data_keys = ("haystack", "chat_template")
    order = 45  # after qa: the suite definition's key order of report.json before sections were registered
    paired_key = PAIRED_KEY
    _chat: Any = None  # the run's chat-template decision (SuiteRun.chat), from begin()

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Keep the run's ``chat_template: auto`` decision: every model's prompts are formatted alike."""
        self._chat = run.chat

    def check(self, settings: Any) -> None:
        """Unknown tasks, options or templates fail when the suite loads."""
        from ctxext.evaluation.sections.ruler.engine import RulerSettings

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
        """Every task of one model (:func:`.engine.evaluate_ruler`)."""
        from ctxext.evaluation.sections.ruler.engine import RulerSettings, evaluate_ruler

        ruler = RulerSettings.of_section(settings, lengths, beyond_context_ok)
        return evaluate_ruler(loaded, ruler, show, self._chat)

    def annotate(self, result: dict[str, Any], spec: Any) -> None:
        """Mark the tasks this model was fine-tuned on (from a run folder's recipe ``data.mixture``)."""
        from ctxext.evaluation.sections.ruler.engine import trained_tasks

        result["trained_tasks"] = trained_tasks(spec.adapter or spec.ref)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """Effective lengths side by side, then score by task × length per model."""
        from ctxext.evaluation.sections.ruler.report import ruler_markdown

        return ruler_markdown(models)

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """``ruler_heatmap.png``: tasks × lengths per model, the effective length framed."""
        from ctxext.evaluation.sections.ruler.report import ruler_heatmap

        return {"ruler_heatmap": ruler_heatmap(plt, models, folder)}

    def paired(
        self, model: dict[str, Any], reference: dict[str, Any], resamples: int, seed: int, notes: list[str]
    ) -> list[dict[str, Any]]:
        """Each task's grid against the reference's, the exact McNemar test on the same trials."""
        from ctxext.evaluation.sections.grids.paired import mcnemar_rows

        theirs = reference["ruler"].get("tasks") or {}
        rows: list[dict[str, Any]] = []
        for task, grid in (model["ruler"].get("tasks") or {}).items():
            if task in theirs:
                rows += mcnemar_rows(model["name"], f"ruler/{task}", grid, theirs[task], notes)
        return rows

    def paired_markdown(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """The retrieval grids' table (the rows share it: ``comparisons.grids``)."""
        from ctxext.evaluation.sections.grids.paired import mcnemar_markdown

        return mcnemar_markdown(rows, reference)

    def paired_summary(self, rows: list[dict[str, Any]], reference: str) -> list[str]:
        """A line per comparison: correct trials of both, McNemar p."""
        from ctxext.evaluation.sections.grids.paired import mcnemar_summary

        return mcnemar_summary(rows, reference)

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """None: per-task grids are too long for a card (the published report has them, and the heatmap)."""
        return []

    def summary(self, entry: dict[str, Any]) -> str | list[str] | None:
        """The effective lengths: the section's definition per task, then RULER's and NoLiMa's."""
        from ctxext.evaluation.sections.ruler.report import summary

        return summary(entry)
