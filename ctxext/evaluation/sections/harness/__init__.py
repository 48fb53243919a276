"""The ``harness:`` suite section: lm-evaluation-harness on each loaded, verified model.

A suite names lm-eval tasks (and an ``include_path`` written by ``ctxext tasks export``, or ``lengths`` to export
ctxext's own tasks first); each model's results land under ``harness`` in its report entry and render as one
table in ``report.md``. Its folder: the settings (:mod:`.settings`, the flags of ``ctxext eval harness``), the
engine (:mod:`.engine`), the results' schema (:mod:`.schema`) and ``report.md`` / console (:mod:`.report`).

Before the first model loads (:meth:`HarnessSection.begin`) the tasks are exported when asked for, every task
name is checked against lm-eval's index and every task's data is loaded once: a typo or a data set that is not
available offline fails before any model is evaluated.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ctxext.errors import InputError
from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section
from ctxext.evaluation.sections.harness.schema import Harness
from ctxext.evaluation.sections.harness.settings import HarnessSettings


@register_section
class HarnessSection(SuiteSection):
    """lm-evaluation-harness on the model ctxext loaded and verified (passed as an object: no RoPE rebuild)."""

    name = "harness"
    title = "lm-evaluation-harness"
    settings = HarnessSettings
    schema = Harness
    order = 60
    data_keys = ("include_path", "chat_template")

    def __init__(self) -> None:
        self._run: tuple[HarnessSettings, Any] | None = None  # the settings every model runs with, lm-eval's index
        self._export: dict[str, Any] | None = None  # what was exported, for the report's data part
        self._folder: tempfile.TemporaryDirectory[str] | None = None  # the export's (removed at exit at the latest)

    def lengths(self, settings: Any) -> list[int | str]:
        """None from the suite: the tasks fix their own lengths (``lengths`` are the export's, in tokens)."""
        return []

    def check(self, settings: Any) -> None:
        """With ``lengths``: ``tasks`` must name ctxext tasks to export."""
        from ctxext.tasks import task_names

        if settings.lengths is not None and not [n for n in settings.tasks if n in task_names()]:
            known = ", ".join(task_names())
            raise InputError(f"harness.lengths exports ctxext's tasks, and harness.tasks names none of them ({known})")

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Export ctxext's tasks (with ``lengths``), then check every task and its data before any model loads."""
        from ctxext.evaluation.sections.harness.engine import check_task_data, task_manager

        self._cleanup()
        self._export = None
        try:
            effective = settings
            if settings.lengths is not None:
                effective = self._exported(settings, run.refs[0] if run.refs else run.models[0])
            manager = task_manager(effective)
            check_task_data(effective, manager)
        except BaseException:
            self._cleanup()
            raise
        self._run = (effective, manager)

    def _exported(self, settings: HarnessSettings, model: str) -> HarnessSettings:
        """Export the registered tasks among ``settings.tasks``; their tags replace them in the task list."""
        from ctxext.evaluation.export_tasks import TASK_PREFIX, export_lm_eval
        from ctxext.evaluation.sections.ruler.engine import RulerSettings
        from ctxext.evaluation.sections.ruler.settings import RulerTaskEntry
        from ctxext.tasks import task_names

        own = [n for n in settings.tasks if n in task_names()]
        ruler = RulerSettings(
            tasks=[RulerTaskEntry(task=n) for n in own],
            lengths=list(settings.lengths or []),
            depths=list(settings.depths),
            trials=settings.trials,
            seed=settings.seed,
            templates=settings.templates,
            chat_template=settings.chat_template,
            allow_beyond_context=settings.allow_beyond_context,
        )
        self._folder = tempfile.TemporaryDirectory(prefix="ctxext-harness-", ignore_cleanup_errors=True)
        folder = Path(self._folder.name) / "tasks"
        result = export_lm_eval(model, folder, ruler)
        # The prompts are built with the first model's tokenizer: the report says which, with the sampling settings
        # and the chat template they are in.
        chat = {"chat_template": result.chat_template, "chat_template_reason": result.chat_template_reason}
        self._export = {"export": {"tokenizer_of": model, "settings": ruler.model_dump(), **chat}}
        tags = [f"{TASK_PREFIX}{n}" if n in own else n for n in settings.tasks]
        return settings.model_copy(update={"tasks": tags, "include_path": str(folder), "lengths": None})

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """What was exported for the run (the tokenizer's model and the sampling), if anything."""
        return self._export

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """The ``harness`` part of one model (:func:`.engine.run_harness`)."""
        from ctxext.evaluation.sections.harness.engine import run_harness

        if self._run is None:  # outside a suite run: nothing exported, the index built here
            return run_harness(loaded, settings)
        effective, manager = self._run
        return run_harness(loaded, effective, manager)

    def finish(self, settings: Any, entries: list[dict[str, Any]]) -> None:
        """Remove the export (the report keeps what it was: :meth:`describe_data`)."""
        self._run = None
        self._cleanup()

    def _cleanup(self) -> None:
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """Each task's metrics per model."""
        from ctxext.evaluation.sections.harness.report import harness_markdown

        return harness_markdown(models)

    def summary(self, entry: dict[str, Any]) -> str | list[str] | None:
        """Each task's metrics and documents."""
        from ctxext.evaluation.sections.harness.report import summary

        return summary(entry)
