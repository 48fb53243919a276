"""The ``qa:`` suite section: long-document QA, SQuAD exact match / F1 by answer position and context length.

Its folder: the settings (:mod:`.settings`, the flags of ``ctxext eval qa``), the engine (:mod:`.engine`: greedy
answers, scored with the SQuAD metric shipped in :mod:`.metrics`), the results' schema (:mod:`.schema`) and
``report.md`` / card / plot (:mod:`.report`). It takes no suite length: ``max_length`` resolves against each
model's contexts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ctxext.evaluation.lengths import Length
from ctxext.evaluation.sections import SuiteRun, SuiteSection, register_section
from ctxext.evaluation.sections.qa.schema import QA
from ctxext.evaluation.sections.qa.settings import QASettings


@register_section
class QASection(SuiteSection):
    """Long-document QA: greedy answers, SQuAD EM / F1 by answer position and context length.

    A suite holding only a qa: section (ctxext eval run), its keys as flags with the same defaults.
    """

    name = "qa"
    title = "Long-document QA"
    settings = QASettings
    schema = QA
    order = 40
    data_keys = ("data", "chat_template")
    _chat: Any = None  # the run's chat-template decision (SuiteRun.chat), from begin()

    def begin(self, settings: Any, run: SuiteRun) -> None:
        """Keep the run's ``chat_template: auto`` decision: every model's prompts are formatted alike."""
        self._chat = run.chat

    def lengths(self, settings: Any) -> list[Length]:
        """None: ``max_length`` resolves against each model's contexts."""
        return []

    def describe_data(self, settings: Any) -> dict[str, Any] | None:
        """The QA data set."""
        from ctxext.scoring.texts import describe_source

        return describe_source(settings.data, split=settings.split)

    def run(
        self, loaded: Any, settings: Any, lengths: list[int], beyond_context_ok: bool, show: bool
    ) -> dict[str, Any]:
        """EM / F1 of one model (:func:`.engine.evaluate_qa`)."""
        from ctxext.evaluation.sections.qa.engine import evaluate_qa

        return evaluate_qa(loaded, settings, show, self._chat)

    def markdown(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """EM / F1 per model, overall and by bucket."""
        from ctxext.evaluation.sections.grids.report import chat_note
        from ctxext.evaluation.sections.qa.report import qa_table

        chats = {(m["qa"].get("chat_template"), m["qa"].get("chat_template_reason")) for m in models if m.get("qa")}
        note = chat_note(chats).strip()
        return ["## Long-document QA", "", *([note, ""] if note else []), *qa_table(models)]

    def card_rows(self, models: list[dict[str, Any]], report: dict[str, Any]) -> list[str]:
        """The report's table."""
        from ctxext.evaluation.sections.qa.report import qa_table

        return ["Long-document QA (exact match / F1, %):", "", *qa_table(models)]

    def plots(self, plt: Any, models: list[dict[str, Any]], folder: Path) -> dict[str, str]:
        """``qa_by_bucket.png``: F1 by answer position and by context length."""
        from ctxext.evaluation.sections.qa.report import qa_plot

        return qa_plot(plt, models, folder)

    def summary(self, entry: dict[str, Any]) -> str | list[str] | None:
        """EM and F1 overall."""
        from ctxext.evaluation.sections.qa.report import summary

        return summary(entry)
