"""The ``harness:`` suite section: lm-evaluation-harness on each loaded, verified model (:mod:`..harness`).

A suite names lm-eval tasks (and an ``include_path`` written by ``ctxext tasks export``); each model's results
land under ``harness`` in its report entry and render as one table in ``report.md``.
"""

from __future__ import annotations

from typing import Any

from ctxext.evaluation.harness import HarnessSettings, harness_markdown, run_harness
from ctxext.evaluation.sections import SuiteSection, register_section


@register_section
class HarnessSection(SuiteSection):
    """lm-eval tasks run on the model object ctxext loaded (no rebuild from a folder)."""

    name = "harness"
    title = "lm-evaluation-harness"
    settings = HarnessSettings
    order = 60
    data_keys = ("include_path",)

    def lengths(self, settings: Any) -> list[int | str]:
        """None: the tasks fix their own lengths."""
        return []

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """The ``harness`` section of one model (:func:`ctxext.evaluation.harness.run_harness`)."""
        return run_harness(loaded, settings)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """Each task's metrics per model."""
        return harness_markdown(models)
